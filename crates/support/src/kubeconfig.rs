//! A client from a kubeconfig file, or from the usual places (in-cluster, $KUBECONFIG,
//! ~/.kube/config). Nothing is asked of the API server here: the operator and the agent start
//! (and serve their endpoints) while it is unreachable.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kubeconfig {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("invalid kubeconfig {}: {source}", path.display())]
    Invalid {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes configuration: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot use the kubeconfig's context: {0}")]
    Context(#[source] kube::config::KubeconfigError),
    #[error("cannot build a client: {0}")]
    Client(#[source] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    kube::Client::try_from(config(kubeconfig, None).await?).map_err(Error::Client)
}

/// The configuration from `kubeconfig` (or the usual places), in `context` (default: the
/// kubeconfig's current context).
async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Read {
                path: path.to_owned(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|source| Error::Invalid {
                    path: path.to_owned(),
                    source,
                })
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(Error::Context),
        (None, None) => kube::Config::infer().await.map_err(Error::Infer),
    }
}

/// Why a command-line tool could not reach the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Config(#[from] Error),
    #[error("cannot reach the API server at {url}: {source}")]
    Unreachable { url: String, source: kube::Error },
}

/// A client for a command run by hand (`podha chaos`, `podha explain`): from `kubeconfig` and
/// `context` as [`client`] finds them, checked by asking for the server version, so that a
/// wrong cluster fails at once and says where it looked.
pub async fn reachable(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, ConnectError> {
    Ok(reachable_target(kubeconfig, context).await?.0)
}

/// The cluster a command run by hand acts on, as a person would name it before saying yes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The kubeconfig context: the one asked for, or the kubeconfig's current one;
    /// `in-cluster` for a pod's own service account.
    pub context: String,
    /// The API server's address.
    pub url: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "context {} (API server {})", self.context, self.url)
    }
}

/// [`reachable`], and which cluster it reached.
pub async fn reachable_target(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(kube::Client, Target), ConnectError> {
    let config = config(kubeconfig, context).await?;
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(Error::Client)?;
    client
        .apiserver_version()
        .await
        .map_err(|source| ConnectError::Unreachable {
            url: url.clone(),
            source,
        })?;
    let context = context_name(kubeconfig, context);
    Ok((client, Target { context, url }))
}

/// The context a client from `kubeconfig` (or the usual places) and `context` uses: the one
/// asked for, else the kubeconfig's current one, else `in-cluster` (no kubeconfig: `infer`
/// fell back to the pod's service account).
fn context_name(kubeconfig: Option<&Path>, context: Option<&str>) -> String {
    if let Some(context) = context {
        return context.to_string();
    }
    let file = match kubeconfig {
        Some(path) => kube::config::Kubeconfig::read_from(path).ok(),
        None => kube::config::Kubeconfig::read().ok(),
    };
    file.and_then(|k| k.current_context)
        .unwrap_or_else(|| "in-cluster".to_string())
}

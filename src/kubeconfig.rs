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
    #[error("cannot build a client: {0}")]
    Client(#[source] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Read {
                path: path.to_owned(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Invalid {
                    path: path.to_owned(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(Error::Infer)?,
    };
    kube::Client::try_from(config).map_err(Error::Client)
}

//! A client from a kubeconfig file, or from the usual places (in-cluster, $KUBECONFIG,
//! ~/.kube/config). Nothing is asked of the API server here: the operator and the agent start
//! (and serve their endpoints) while it is unreachable.

use std::path::Path;

pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("invalid kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes configuration: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))
}

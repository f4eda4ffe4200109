//! Serves the CSI services on a unix socket, as the sidecars and the kubelet expect.

use std::future::Future;
use std::path::Path;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::controller::ControllerService;
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::proto::controller_server::ControllerServer;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;

/// Binds `socket` (a stale socket file from an earlier run is replaced) and serves until
/// `shutdown` completes.
pub async fn serve(
    socket: &Path,
    identity: IdentityService,
    controller: Option<ControllerService>,
    node: Option<NodeService>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", socket.display())),
    }
    let listener =
        UnixListener::bind(socket).map_err(|e| anyhow::anyhow!("{}: {e}", socket.display()))?;
    tracing::info!(socket = %socket.display(), driver = %identity.driver, "serving CSI");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_optional_service(controller.map(ControllerServer::new))
        .add_optional_service(node.map(NodeServer::new))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}

//! Serves the CSI services on a unix socket, as the sidecars and the kubelet expect.

use std::future::Future;
use std::path::Path;

use tokio::io::DuplexStream;
use tokio::net::UnixListener;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::wrappers::UnixListenerStream;

use crate::authority;
use crate::controller::ControllerService;
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::pluginregistration::registration_server::RegistrationServer;
use crate::proto::controller_server::ControllerServer;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;
use crate::registration::RegistrationService;

/// Binds `socket` (a stale socket file from an earlier run is replaced) and serves until
/// `shutdown` completes; the socket file is removed then.
pub async fn serve(
    socket: &Path,
    identity: IdentityService,
    controller: Option<ControllerService>,
    node: Option<NodeService>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), driver = %identity.driver, "serving CSI");
    let served = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_optional_service(controller.map(ControllerServer::new))
        .add_optional_service(node.map(NodeServer::new))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    remove_socket(socket);
    Ok(served?)
}

/// Serves the kubelet's `Registration` service on `socket` (in the kubelet's
/// `plugins_registry`) until `shutdown` completes; the socket file is removed then, which tells
/// the kubelet the plugin is gone. Every connection goes through [`authority::relay`], which
/// gives the kubelet's requests an authority the HTTP/2 stack accepts.
pub async fn serve_registration(
    socket: &Path,
    registration: RegistrationService,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), driver = %registration.driver, "serving the kubelet's registration API");
    let (connections, incoming) = tokio::sync::mpsc::channel::<std::io::Result<DuplexStream>>(8);
    let accept = async move {
        loop {
            let client = match listener.accept().await {
                Ok((client, _)) => client,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a registration connection");
                    continue;
                }
            };
            let (relay_end, server_end) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                if let Err(e) = authority::relay(client, relay_end).await {
                    tracing::debug!(error = %e, "registration connection ended");
                }
            });
            if connections.send(Ok(server_end)).await.is_err() {
                return;
            }
        }
    };
    let served = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registration))
        .serve_with_incoming_shutdown(ReceiverStream::new(incoming), shutdown);
    let served = tokio::select! {
        served = served => served,
        () = accept => Ok(()),
    };
    remove_socket(socket);
    Ok(served?)
}

/// A listener on `socket`, its directory created and a stale socket file replaced.
fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", socket.display())),
    }
    UnixListener::bind(socket).map_err(|e| anyhow::anyhow!("{}: {e}", socket.display()))
}

/// Removes a socket file; one already gone is fine.
pub fn remove_socket(socket: &Path) {
    if let Err(e) = std::fs::remove_file(socket)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(socket = %socket.display(), error = %e, "could not remove the socket");
    }
}

//! Registration with the kubelet (its plugin registration API v1), the job the
//! node-driver-registrar sidecar does for other CSI drivers; that sidecar is not served by the
//! Go module proxy, so podha-csi does it itself.
//!
//! The kubelet watches `<root dir>/plugins_registry` for sockets. On a new one it calls
//! `GetInfo`: a `CSIPlugin` named after the driver, at the CSI endpoint given (the kubelet
//! then calls the Node service there: NodeGetInfo, and it writes the node's CSINode). It reports
//! the outcome with `NotifyRegistrationStatus`; a refusal ends `serve` with an error, so the
//! container restarts and registration is tried again.

use std::path::PathBuf;

use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::pluginregistration::registration_server::Registration;
use crate::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The plugin type the kubelet's CSI plugin handler takes.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions podha-csi serves.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// The `Registration` service of one driver.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    pub driver: String,
    /// The CSI socket as the kubelet sees it.
    pub endpoint: PathBuf,
    /// Where a refusal is reported, for `serve` to stop on.
    pub refused: mpsc::UnboundedSender<String>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::info!(driver = %self.driver, endpoint = %self.endpoint.display(), "the kubelet asked for the plugin's info");
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the registration");
            let _ = self.refused.send(status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

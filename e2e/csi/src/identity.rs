//! The CSI Identity service.

use tonic::{Request, Response, Status};

use crate::proto::identity_server::Identity;
use crate::proto::plugin_capability::service::Type as ServiceType;
use crate::proto::*;

#[derive(Debug, Clone)]
pub struct IdentityService {
    pub driver: String,
    /// Whether this process serves the Controller service.
    pub controller: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.driver.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let capabilities = self
            .controller
            .then(|| PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: ServiceType::ControllerService as i32,
                    },
                )),
            })
            .into_iter()
            .collect();
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

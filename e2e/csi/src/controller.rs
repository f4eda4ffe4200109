//! The CSI Controller service: CreateVolume/DeleteVolume, ControllerPublishVolume /
//! ControllerUnpublishVolume (PUBLISH_UNPUBLISH_VOLUME) with delays that model the storage's
//! attach and detach time. Everything else answers UNIMPLEMENTED, as the spec allows for
//! capabilities a plugin does not report.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::capability::{self, required};
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::rpc::Type as RpcType;
use crate::proto::*;
use crate::store::{self, NewVolume, Store};

/// A volume's size when the claim asks for none.
const DEFAULT_CAPACITY: i64 = 1 << 30;
/// The StorageClass parameter that overrides the controller's fencing default: `"on"`/`"off"`.
pub const FENCING_PARAMETER: &str = "fencing";

#[derive(Debug, Clone)]
pub struct ControllerService {
    pub store: Store,
    pub driver: String,
    pub attach_delay: Duration,
    pub detach_delay: Duration,
    /// Fencing of new volumes unless their parameters say otherwise.
    pub fencing: bool,
}

impl ControllerService {
    fn volume(&self, id: &str) -> Result<store::Volume, Status> {
        let volume = self.store.volume(id).map_err(capability::status)?;
        let record = volume.record().map_err(capability::status)?;
        if record.driver != self.driver {
            return Err(Status::not_found(format!(
                "volume {id} belongs to driver {}",
                record.driver
            )));
        }
        Ok(volume)
    }

    fn fencing(&self, parameters: &HashMap<String, String>) -> Result<bool, Status> {
        match parameters.get(FENCING_PARAMETER).map(String::as_str) {
            None => Ok(self.fencing),
            Some("on") => Ok(true),
            Some("off") => Ok(false),
            Some(other) => Err(Status::invalid_argument(format!(
                "parameter {FENCING_PARAMETER}: {other:?} is neither \"on\" nor \"off\""
            ))),
        }
    }
}

fn capacity(range: Option<&CapacityRange>) -> Result<i64, Status> {
    let Some(range) = range else {
        return Ok(DEFAULT_CAPACITY);
    };
    let (required, limit) = (range.required_bytes, range.limit_bytes);
    if required < 0 || limit < 0 || (limit > 0 && required > limit) {
        return Err(Status::out_of_range(format!(
            "capacity range {required}..{limit} is invalid"
        )));
    }
    Ok(if required > 0 {
        required
    } else if limit > 0 {
        limit
    } else {
        DEFAULT_CAPACITY
    })
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not supported by podha-csi"))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        let name = required(&request.name, "name")?;
        if request.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volume content sources (snapshots, clones) are not supported",
            ));
        }
        let access_mode = capability::access_mode(&request.volume_capabilities)?;
        let new = NewVolume {
            id: name,
            driver: &self.driver,
            capacity_bytes: capacity(request.capacity_range.as_ref())?,
            access_mode,
            fencing: self.fencing(&request.parameters)?,
        };
        let record = self.store.create_volume(&new).map_err(capability::status)?;
        tracing::info!(volume = %record.id, mode = ?record.access_mode, fencing = record.fencing, "volume created");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: record.capacity_bytes,
                volume_id: record.id,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = required(&request.get_ref().volume_id, "volume_id")?;
        match self.volume(id) {
            Ok(_) => self.store.delete_volume(id).map_err(capability::status)?,
            // Unknown: already deleted, which DeleteVolume treats as success.
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(status),
        }
        tracing::info!(volume = %id, "volume deleted");
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = required(&request.volume_id, "volume_id")?;
        let node = required(&request.node_id, "node_id")?;
        let capability = request
            .volume_capability
            .ok_or_else(|| Status::invalid_argument("volume_capability missing"))?;
        let asked = capability::access_mode(std::slice::from_ref(&capability))?;
        let volume = self.volume(id)?;
        let record = volume.record().map_err(capability::status)?;
        if asked != record.access_mode {
            return Err(Status::invalid_argument(format!(
                "volume {id} has access mode {:?}, not {asked:?}",
                record.access_mode
            )));
        }
        tokio::time::sleep(self.attach_delay).await;
        volume.publish(node).map_err(capability::status)?;
        tracing::info!(volume = %id, %node, "published");
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: HashMap::new(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = required(&request.volume_id, "volume_id")?;
        let volume = match self.volume(id) {
            Ok(volume) => volume,
            // The spec: an unknown volume can be regarded as unpublished, answer OK.
            Err(status) if status.code() == tonic::Code::NotFound => {
                return Ok(Response::new(ControllerUnpublishVolumeResponse {}));
            }
            Err(status) => return Err(status),
        };
        tokio::time::sleep(self.detach_delay).await;
        if request.node_id.is_empty() {
            // No node: unpublish from every node.
            for node in volume.record().map_err(capability::status)?.published {
                volume.unpublish(&node).map_err(capability::status)?;
            }
        } else {
            volume
                .unpublish(&request.node_id)
                .map_err(capability::status)?;
        }
        tracing::info!(volume = %id, node = %request.node_id, "unpublished");
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        let id = required(&request.volume_id, "volume_id")?;
        let record = self.volume(id)?.record().map_err(capability::status)?;
        let confirmed = match capability::access_mode(&request.volume_capabilities) {
            Ok(mode) if mode == record.access_mode => {
                Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: request.volume_context,
                    volume_capabilities: request.volume_capabilities,
                    parameters: request.parameters,
                    mutable_parameters: request.mutable_parameters,
                })
            }
            _ => None,
        };
        let message = if confirmed.is_some() {
            String::new()
        } else {
            format!("volume {id} is {:?}", record.access_mode)
        };
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed,
            message,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |kind: RpcType| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc {
                    r#type: kind as i32,
                },
            )),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(RpcType::CreateDeleteVolume),
                rpc(RpcType::PublishUnpublishVolume),
                rpc(RpcType::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn list_volumes(
        &self,
        _: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        unimplemented()
    }
    async fn controller_list_volume_health(
        &self,
        _: Request<ControllerListVolumeHealthRequest>,
    ) -> Result<Response<ControllerListVolumeHealthResponse>, Status> {
        unimplemented()
    }
    async fn controller_get_volume_health(
        &self,
        _: Request<ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<ControllerGetVolumeHealthResponse>, Status> {
        unimplemented()
    }
    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        unimplemented()
    }
    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        unimplemented()
    }
    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        unimplemented()
    }
    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unimplemented()
    }
    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        unimplemented()
    }
    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        unimplemented()
    }
    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unimplemented()
    }
    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        unimplemented()
    }
}

//! The CSI Node service: NodeStageVolume bind-mounts the volume's directory (on the shared
//! store) at the staging path, NodePublishVolume bind-mounts the staging path at the pod's
//! target path. NodeGetInfo reports the node's id and a topology segment.

use std::path::Path;

use tonic::{Request, Response, Status};

use crate::capability::{self, required};
use crate::mount;
use crate::proto::node_server::Node;
use crate::proto::node_service_capability::rpc::Type as RpcType;
use crate::proto::*;
use crate::store::{AccessMode, Store};

/// The topology key NodeGetInfo reports; its value is the node id.
pub const TOPOLOGY_KEY: &str = "topology.sim.podha.io/node";

#[derive(Debug, Clone)]
pub struct NodeService {
    pub store: Store,
    pub driver: String,
    pub node_id: String,
}

impl NodeService {
    fn volume(&self, id: &str) -> Result<crate::store::Volume, Status> {
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
}

fn mount_error(error: std::io::Error) -> Status {
    Status::internal(format!("mount: {error}"))
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not supported by podha-csi"))
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = required(&request.volume_id, "volume_id")?;
        let staging = required(&request.staging_target_path, "staging_target_path")?;
        let capability = request
            .volume_capability
            .ok_or_else(|| Status::invalid_argument("volume_capability missing"))?;
        capability::access_mode(std::slice::from_ref(&capability))?;
        let volume = self.volume(id)?;
        mount::bind(volume.dir(), Path::new(staging), false).map_err(mount_error)?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        let staging = required(&request.staging_target_path, "staging_target_path")?;
        mount::unmount(Path::new(staging)).map_err(mount_error)?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = required(&request.volume_id, "volume_id")?;
        let staging = required(&request.staging_target_path, "staging_target_path")?;
        let target = required(&request.target_path, "target_path")?;
        let capability = request
            .volume_capability
            .ok_or_else(|| Status::invalid_argument("volume_capability missing"))?;
        let asked = capability::access_mode(std::slice::from_ref(&capability))?;
        let volume = self.volume(id)?;
        let record = volume.record().map_err(capability::status)?;
        if asked != record.access_mode
            && !(asked == AccessMode::SingleNodeWriter
                && record.access_mode == AccessMode::SingleNodeSingleWriter)
        {
            return Err(Status::invalid_argument(format!(
                "volume {id} has access mode {:?}, not {asked:?}",
                record.access_mode
            )));
        }
        if !mount::is_mount_point(Path::new(staging)).map_err(mount_error)? {
            return Err(Status::failed_precondition(format!(
                "volume {id} is not staged at {staging}"
            )));
        }
        volume
            .add_target(&self.node_id, target)
            .map_err(capability::status)?;
        if let Err(e) = mount::bind(Path::new(staging), Path::new(target), request.readonly) {
            volume
                .remove_target(&self.node_id, target)
                .map_err(capability::status)?;
            return Err(mount_error(e));
        }
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = required(&request.volume_id, "volume_id")?;
        let target = required(&request.target_path, "target_path")?;
        mount::unmount(Path::new(target)).map_err(mount_error)?;
        if let Err(e) = std::fs::remove_dir(target)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(Status::internal(format!("{target}: {e}")));
        }
        match self.store.volume(id) {
            Ok(volume) => {
                volume
                    .remove_target(&self.node_id, target)
                    .map_err(capability::status)?;
            }
            Err(crate::store::Error::NotFound(_)) => {}
            Err(e) => return Err(capability::status(e)),
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let rpc = |kind: RpcType| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc {
                    r#type: kind as i32,
                },
            )),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(RpcType::StageUnstageVolume),
                rpc(RpcType::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology {
                segments: [(TOPOLOGY_KEY.to_string(), self.node_id.clone())].into(),
            }),
        }))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        unimplemented()
    }
    async fn node_get_volume_health(
        &self,
        _: Request<NodeGetVolumeHealthRequest>,
    ) -> Result<Response<NodeGetVolumeHealthResponse>, Status> {
        unimplemented()
    }
    async fn node_get_storage_health(
        &self,
        _: Request<NodeGetStorageHealthRequest>,
    ) -> Result<Response<NodeGetStorageHealthResponse>, Status> {
        unimplemented()
    }
    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        unimplemented()
    }
}

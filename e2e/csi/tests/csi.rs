//! podha-csi over its unix socket, as the sidecars and the kubelet call it: the answers and the
//! error codes the CSI spec prescribes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use podha_csi::controller::ControllerService;
use podha_csi::identity::IdentityService;
use podha_csi::node::{NodeService, TOPOLOGY_KEY};
use podha_csi::proto::controller_client::ControllerClient;
use podha_csi::proto::identity_client::IdentityClient;
use podha_csi::proto::node_client::NodeClient;
use podha_csi::proto::volume_capability::access_mode::Mode;
use podha_csi::proto::volume_capability::{AccessMode, AccessType, MountVolume};
use podha_csi::proto::*;
use podha_csi::store::Store;
use podha_csi::{mount, server};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const DRIVER: &str = "rwo.sim.podha.io";

struct Plugin {
    dir: tempfile::TempDir,
    channel: Channel,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Plugin {
    /// A plugin serving Controller and Node (as `node-a`) for DRIVER, on a fresh store.
    async fn start() -> Plugin {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("san")).unwrap();
        let socket = dir.path().join("csi.sock");
        let controller = ControllerService {
            store: store.clone(),
            driver: DRIVER.into(),
            attach_delay: Duration::ZERO,
            detach_delay: Duration::ZERO,
            fencing: true,
        };
        let node = NodeService {
            store,
            driver: DRIVER.into(),
            node_id: "node-a".into(),
        };
        let identity = IdentityService {
            driver: DRIVER.into(),
            controller: true,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let shutdown = async {
            let _ = rx.await;
        };
        let serving = socket.clone();
        let task = tokio::spawn(async move {
            server::serve(&serving, identity, Some(controller), Some(node), shutdown).await
        });
        let channel = connect(&socket).await;
        Plugin {
            dir,
            channel,
            shutdown: Some(tx),
            task,
        }
    }

    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

async fn connect(socket: &Path) -> Channel {
    for _ in 0..100 {
        if socket.exists() {
            let socket = socket.to_path_buf();
            let connector = tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            });
            // The URI is required by the API and ignored by the connector.
            return Endpoint::from_static("http://[::]:0")
                .connect_with_connector(connector)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the plugin never created {}", socket.display());
}

fn capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn create(name: &str, mode: Mode) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![capability(mode)],
        ..Default::default()
    }
}

fn publish(volume: &str, node: &str, mode: Mode) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(capability(mode)),
        ..Default::default()
    }
}

fn unpublish(volume: &str, node: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn identity_names_the_driver_and_offers_the_controller_service() {
    let plugin = Plugin::start().await;
    let mut identity = IdentityClient::new(plugin.channel.clone());
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, DRIVER);
    let capabilities = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capabilities.capabilities.len(), 1);
    assert_eq!(
        identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    let controller = plugin
        .controller()
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap();
    let rpcs: Vec<i32> = controller
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(controller_service_capability::Type::Rpc(rpc)) => Some(rpc.r#type),
            _ => None,
        })
        .collect();
    use controller_service_capability::rpc::Type;
    assert_eq!(
        rpcs,
        vec![
            Type::CreateDeleteVolume as i32,
            Type::PublishUnpublishVolume as i32,
            Type::SingleNodeMultiWriter as i32
        ]
    );
    plugin.stop().await;
}

#[tokio::test]
async fn unknown_volumes_are_not_found_except_where_the_spec_says_ok() {
    let plugin = Plugin::start().await;
    let mut controller = plugin.controller();
    let err = controller
        .controller_publish_volume(publish("pvc-nope", "node-a", Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let validate = ValidateVolumeCapabilitiesRequest {
        volume_id: "pvc-nope".into(),
        volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
        ..Default::default()
    };
    assert_eq!(
        controller
            .validate_volume_capabilities(validate)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    // ControllerUnpublishVolume and DeleteVolume of an unknown volume: OK (already done).
    controller
        .controller_unpublish_volume(unpublish("pvc-nope", "node-a"))
        .await
        .unwrap();
    controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: "pvc-nope".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let stage = NodeStageVolumeRequest {
        volume_id: "pvc-nope".into(),
        staging_target_path: plugin.path("staging").display().to_string(),
        volume_capability: Some(capability(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    assert_eq!(
        plugin
            .node()
            .node_stage_volume(stage)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    plugin.stop().await;
}

#[tokio::test]
async fn a_read_write_once_volume_cannot_be_published_to_a_second_node() {
    let plugin = Plugin::start().await;
    let mut controller = plugin.controller();
    for (name, mode) in [
        ("pvc-rwo", Mode::SingleNodeWriter),
        ("pvc-rwop", Mode::SingleNodeSingleWriter),
    ] {
        controller.create_volume(create(name, mode)).await.unwrap();
        controller
            .controller_publish_volume(publish(name, "node-a", mode))
            .await
            .unwrap();
        controller
            .controller_publish_volume(publish(name, "node-a", mode))
            .await
            .expect("publish is idempotent");
        let err = controller
            .controller_publish_volume(publish(name, "node-b", mode))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{name}: {err:?}");
        controller
            .controller_unpublish_volume(unpublish(name, "node-a"))
            .await
            .unwrap();
        controller
            .controller_publish_volume(publish(name, "node-b", mode))
            .await
            .unwrap();
    }
    controller
        .create_volume(create("pvc-rwx", Mode::MultiNodeMultiWriter))
        .await
        .unwrap();
    for node in ["node-a", "node-b"] {
        controller
            .controller_publish_volume(publish("pvc-rwx", node, Mode::MultiNodeMultiWriter))
            .await
            .unwrap();
    }
    plugin.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments() {
    let plugin = Plugin::start().await;
    let mut controller = plugin.controller();
    let no_name = create("", Mode::SingleNodeWriter);
    assert_eq!(
        controller.create_volume(no_name).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let reader = create("pvc-1", Mode::MultiNodeReaderOnly);
    assert_eq!(
        controller.create_volume(reader).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut bad_fencing = create("pvc-1", Mode::SingleNodeWriter);
    bad_fencing
        .parameters
        .insert("fencing".into(), "maybe".into());
    assert_eq!(
        controller
            .create_volume(bad_fencing)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    controller
        .create_volume(create("pvc-1", Mode::SingleNodeWriter))
        .await
        .unwrap();
    let other_mode = create("pvc-1", Mode::MultiNodeMultiWriter);
    assert_eq!(
        controller
            .create_volume(other_mode)
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );
    let no_node = publish("pvc-1", "", Mode::SingleNodeWriter);
    assert_eq!(
        controller
            .controller_publish_volume(no_node)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    plugin.stop().await;
}

#[tokio::test]
async fn a_published_volume_is_not_deleted() {
    let plugin = Plugin::start().await;
    let mut controller = plugin.controller();
    controller
        .create_volume(create("pvc-1", Mode::SingleNodeWriter))
        .await
        .unwrap();
    controller
        .controller_publish_volume(publish("pvc-1", "node-a", Mode::SingleNodeWriter))
        .await
        .unwrap();
    let delete = DeleteVolumeRequest {
        volume_id: "pvc-1".into(),
        ..Default::default()
    };
    assert_eq!(
        controller
            .delete_volume(delete.clone())
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition
    );
    controller
        .controller_unpublish_volume(unpublish("pvc-1", "node-a"))
        .await
        .unwrap();
    controller.delete_volume(delete).await.unwrap();
    plugin.stop().await;
}

#[tokio::test]
async fn node_info_reports_the_node_and_its_topology() {
    let plugin = Plugin::start().await;
    let info = plugin
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(
        segments.get(TOPOLOGY_KEY).map(String::as_str),
        Some("node-a")
    );
    plugin.stop().await;
}

/// Stage and publish are real bind mounts: needs root (CAP_SYS_ADMIN), as any CSI node plugin.
#[tokio::test]
async fn stage_and_publish_bind_mount_the_volume_directory() {
    let plugin = Plugin::start().await;
    let mut controller = plugin.controller();
    let mut node = plugin.node();
    let mode = Mode::SingleNodeSingleWriter;
    controller
        .create_volume(create("pvc-1", mode))
        .await
        .unwrap();
    controller
        .controller_publish_volume(publish("pvc-1", "node-a", mode))
        .await
        .unwrap();
    let staging = plugin.path("staging");
    let target = plugin.path("pod-1/volume");
    let stage = NodeStageVolumeRequest {
        volume_id: "pvc-1".into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability(mode)),
        ..Default::default()
    };
    node.node_stage_volume(stage.clone())
        .await
        .expect("NodeStageVolume (bind mounts need root)");
    node.node_stage_volume(stage)
        .await
        .expect("NodeStageVolume is idempotent");
    let publish_at = |target: &Path| NodePublishVolumeRequest {
        volume_id: "pvc-1".into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(mode)),
        ..Default::default()
    };
    node.node_publish_volume(publish_at(&target)).await.unwrap();
    assert!(mount::is_mount_point(&target).unwrap());
    // The pod sees the volume's own directory: its record is there.
    assert!(target.join("volume.json").is_file());
    // ReadWriteOncePod: a second pod's target is refused.
    let second = node
        .node_publish_volume(publish_at(&plugin.path("pod-2/volume")))
        .await
        .unwrap_err();
    assert_eq!(second.code(), Code::FailedPrecondition, "{second:?}");
    let unpublish_at = NodeUnpublishVolumeRequest {
        volume_id: "pvc-1".into(),
        target_path: target.display().to_string(),
    };
    node.node_unpublish_volume(unpublish_at.clone())
        .await
        .unwrap();
    node.node_unpublish_volume(unpublish_at)
        .await
        .expect("NodeUnpublishVolume is idempotent");
    assert!(!target.exists());
    let unstage = NodeUnstageVolumeRequest {
        volume_id: "pvc-1".into(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(!mount::is_mount_point(&staging).unwrap());
    plugin.stop().await;
}

/// The sidecars send ReadWriteOnce as SINGLE_NODE_MULTI_WRITER to a plugin that reports that
/// capability: it is a one-node volume like SINGLE_NODE_WRITER.
#[tokio::test]
async fn single_node_multi_writer_is_read_write_once() {
    let plugin = Plugin::start().await;
    let mut controller = plugin.controller();
    let mode = Mode::SingleNodeMultiWriter;
    controller
        .create_volume(create("pvc-1", mode))
        .await
        .unwrap();
    controller
        .controller_publish_volume(publish("pvc-1", "node-a", mode))
        .await
        .unwrap();
    let err = controller
        .controller_publish_volume(publish("pvc-1", "node-b", mode))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    plugin.stop().await;
}

//! `podha-csi serve` registering with the kubelet as the kubelet's plugin watcher sees it: a
//! socket in `plugins_registry` answering GetInfo, then NotifyRegistrationStatus. A refusal
//! ends the process with the kubelet's error; a TERM ends it cleanly, sockets removed.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use podha_csi::pluginregistration::registration_client::RegistrationClient;
use podha_csi::pluginregistration::{InfoRequest, RegistrationStatus};
use podha_csi::proto::NodeGetInfoRequest;
use podha_csi::proto::node_client::NodeClient;
use tonic::transport::{Channel, Endpoint};

const DRIVER: &str = "rwo.sim.podha.io";

struct Served {
    dir: tempfile::TempDir,
    child: Child,
}

impl Served {
    fn start() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_podha-csi"))
            .args(["serve", "--driver", DRIVER, "--node-id", "node-a"])
            .arg("--store")
            .arg(dir.path().join("san"))
            .arg("--socket")
            .arg(dir.path().join("plugins/csi.sock"))
            .arg("--registration-socket")
            .arg(dir.path().join("plugins_registry/reg.sock"))
            .args([
                "--kubelet-endpoint",
                "/var/lib/kubelet/plugins/rwo/csi.sock",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Served { dir, child }
    }

    fn socket(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// Waits up to 10 s for the process to exit; its status and output.
    fn wait_exit(&mut self) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "podha-csi serve did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut text = String::new();
        for pipe in [
            self.child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read>),
            self.child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read>),
        ]
        .into_iter()
        .flatten()
        {
            let mut pipe = pipe;
            std::io::Read::read_to_string(&mut pipe, &mut text).unwrap();
        }
        (status, text)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

async fn connect(socket: &Path) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let socket = socket.to_path_buf();
    let connector = tower::service_fn(move |_| {
        let socket = socket.clone();
        async move {
            Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?))
        }
    });
    // The URI is required by the API and ignored by the connector.
    Endpoint::from_static("http://[::]:0")
        .connect_with_connector(connector)
        .await
        .unwrap()
}

fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn the_kubelet_learns_the_driver_and_its_endpoint_and_a_term_removes_the_sockets() {
    let mut served = Served::start();
    let mut registration =
        RegistrationClient::new(connect(&served.socket("plugins_registry/reg.sock")).await);
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/rwo/csi.sock");
    assert_eq!(info.supported_versions, ["1.0.0"]);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    // Registered: the Node service answers on the CSI socket, as the kubelet calls it next.
    let mut node = NodeClient::new(connect(&served.socket("plugins/csi.sock")).await);
    let node_info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, "node-a");

    terminate(&served.child);
    let (reg, csi) = (
        served.socket("plugins_registry/reg.sock"),
        served.socket("plugins/csi.sock"),
    );
    let (status, output) = served.wait_exit();
    assert!(status.success(), "{status}: {output}");
    assert!(
        !reg.exists() && !csi.exists(),
        "sockets left behind: {output}"
    );
}

#[tokio::test]
async fn a_refused_registration_ends_serve_with_the_kubelets_error() {
    let mut served = Served::start();
    let mut registration =
        RegistrationClient::new(connect(&served.socket("plugins_registry/reg.sock")).await);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "no such version".into(),
        })
        .await
        .unwrap();
    let (status, output) = served.wait_exit();
    assert!(!status.success(), "serve went on after a refusal: {output}");
    assert!(output.contains("no such version"), "{output}");
}

#[test]
fn registration_needs_a_node() {
    let out = Command::new(env!("CARGO_BIN_EXE_podha-csi"))
        .args([
            "serve",
            "--driver",
            DRIVER,
            "--controller",
            "--store",
            "/nonexistent",
        ])
        .args([
            "--socket",
            "/nonexistent/csi.sock",
            "--registration-socket",
            "/x/reg.sock",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--node-id"),
        "{out:?}"
    );
}

//! The `podha-csi write` and `podha-csi check` commands, as a pod and a test run them.

use std::process::Command;

use podha_csi::checker::Report;
use podha_csi::store::{AccessMode, NewVolume, Store};

#[test]
fn the_writer_program_writes_through_its_node_and_the_checker_reads_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("san")).unwrap();
    let new = NewVolume {
        id: "pvc-1",
        driver: "rwo.sim.podha.io",
        capacity_bytes: 1,
        access_mode: AccessMode::SingleNodeWriter,
        fencing: false,
    };
    store.create_volume(&new).unwrap();
    let volume = store.volume("pvc-1").unwrap();
    volume.publish("node-a").unwrap();
    let write = |node: &str, pod: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_podha-csi"))
            .args(["write", "--interval", "1ms", "--count", "3"])
            .arg("--volume-dir")
            .arg(volume.dir())
            .args(["--node", node, "--pod-uid", pod])
            .arg("--acks")
            .arg(dir.path().join(format!("{pod}.acks")))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(write("node-a", "p1").trim(), "acknowledged 3 refused 0");
    // Unfenced storage: node-a keeps its access after the volume moves to node-b.
    volume.unpublish("node-a").unwrap();
    volume.publish("node-b").unwrap();
    assert_eq!(write("node-b", "p2").trim(), "acknowledged 3 refused 0");
    assert_eq!(write("node-a", "p1").trim(), "acknowledged 3 refused 0");
    let output = Command::new(env!("CARGO_BIN_EXE_podha-csi"))
        .arg("check")
        .arg("--volume-dir")
        .arg(volume.dir())
        .arg("--acks")
        .arg(dir.path().join("p1.acks"))
        .arg("--acks")
        .arg(dir.path().join("p2.acks"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let report: Report = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report.accepted_writes, 9);
    assert_eq!(report.split_brain_writes.len(), 3, "{report:?}");
    assert!(report.split_brain_writes.iter().all(|w| w.node == "node-a"));
    // p1's second run restarted at 1: its acks repeat, the log holds every one.
    assert!(report.lost_acknowledged_writes.is_empty(), "{report:?}");
}

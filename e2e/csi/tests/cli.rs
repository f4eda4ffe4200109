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

#[test]
fn the_checker_reads_the_acknowledgements_of_the_volumes_own_writers_from_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("san")).unwrap();
    let acks = dir.path().join("acks");
    std::fs::create_dir_all(&acks).unwrap();
    for id in ["pvc-1", "pvc-2"] {
        let new = NewVolume {
            id,
            driver: "rwo.sim.podha.io",
            capacity_bytes: 1,
            access_mode: AccessMode::SingleNodeWriter,
            fencing: true,
        };
        store.create_volume(&new).unwrap();
        store.volume(id).unwrap().publish("node-a").unwrap();
    }
    let write = |volume: &str, pod: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_podha-csi"))
            .args(["write", "--interval", "1ms", "--count", "2"])
            .arg("--volume-dir")
            .arg(store.volume(volume).unwrap().dir())
            .args(["--node", "node-a", "--pod-uid", pod])
            .arg("--acks")
            .arg(acks.join(format!("{pod}.acks")))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
    };
    write("pvc-1", "p1");
    write("pvc-2", "p2");
    // An acknowledgement no write backs: the checker must find it among pvc-1's writers.
    std::fs::write(
        acks.join("p1.acks"),
        std::fs::read_to_string(acks.join("p1.acks")).unwrap()
            + "{\"node\":\"node-a\",\"pod_uid\":\"p1\",\"seq\":99}\n",
    )
    .unwrap();
    let check = |volume: &str| -> Report {
        let output = Command::new(env!("CARGO_BIN_EXE_podha-csi"))
            .arg("check")
            .arg("--volume-dir")
            .arg(store.volume(volume).unwrap().dir())
            .arg("--acks-dir")
            .arg(&acks)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let one = check("pvc-1");
    assert_eq!(one.accepted_writes, 2);
    assert_eq!(one.lost_acknowledged_writes.len(), 1, "{one:?}");
    assert_eq!(one.lost_acknowledged_writes[0].seq, 99);
    // p1's acknowledgements are not pvc-2's: its writes are all there.
    let two = check("pvc-2");
    assert!(two.clean() && two.accepted_writes == 2, "{two:?}");
}

//! `podha chaos` against the sim cluster's real control plane (profile `fast`, three kwok
//! nodes) with podha running as its own process:
//! - a workload no policy would move is refused, naming the rule (namespace not selected; a
//!   policy whose driver list leaves the volume out);
//! - two `sim-kill` trials pass: table, JSON and SVG written, every invariant held; and one of
//!   a Deployment, whose replacement has another name;
//! - a fault command that also deletes a decoy pod podha must leave alone fails the
//!   `bystanders-kept` invariant, and the command exits non-zero naming it.
//!
//! Needs the control-plane binaries (`make k8s`) and the `podha-sim` executable (`cargo build
//! -p podha-sim`); without them the test fails saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::api::PostParams;
use podha::chaos::{self, ChaosArgs};
use podha_sim::cluster::Cluster;
use podha_sim::failover::{Operator, apply_policy, install_crd};
use podha_sim::testkit::{SharedCluster, create_namespace, deployment, pvc, statefulset, wait_for};
use serde_json::json;

/// Workloads that get faulted live on node-1 and node-2; those only judged live on node-3, so
/// that no pod podha must leave alone shares a faulted node by accident.
const FAULTED: [&str; 2] = ["node-1", "node-2"];
const JUDGED: [&str; 1] = ["node-3"];

fn sim_exe() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("PODHA_SIM_EXE").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()?;
    let found = me
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("podha-sim"))
        .find(|c| c.is_file());
    found.context("the podha-sim executable is missing: build it with `cargo build -p podha-sim`")
}

fn args(ns: &str, fault: &str, out_dir: &Path, sim_dir: &Path, podha_sim: &Path) -> ChaosArgs {
    ChaosArgs {
        kubeconfig: Some(sim_dir.join("kubeconfig")),
        context: None,
        yes: true,
        namespace: ns.to_string(),
        statefulset: Some("db".to_string()),
        deployment: None,
        trials: 1,
        fault: fault.to_string(),
        restore: None,
        data_check: None,
        check: None,
        check_timeout: std::time::Duration::from_secs(300),
        data_settle: Duration::from_secs(2),
        podha_csi: "podha-csi".into(),
        sim_dir: Some(sim_dir.to_path_buf()),
        podha_sim: podha_sim.display().to_string(),
        expect: chaos::Expect::Moved,
        hold: Duration::from_secs(60),
        timeout: Duration::from_secs(180),
        settle_timeout: Duration::from_secs(120),
        out: out_dir.join(format!("{ns}.json")),
        svg: None,
        podha_namespace: None,
        leader_lease: podha::leader::DEFAULT_LEASE_NAME.to_string(),
    }
}

/// `podha chaos` as a user runs it: exit code, stdout, stderr.
fn podha_chaos(args: &ChaosArgs) -> anyhow::Result<(Option<i32>, String, String)> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podha"));
    cmd.arg("chaos")
        .arg("--kubeconfig")
        .arg(args.kubeconfig.as_ref().context("kubeconfig")?)
        .args(["--namespace", &args.namespace])
        .args(["--statefulset", args.statefulset.as_deref().unwrap_or("db")])
        .args(["--fault", &args.fault])
        .args(["--podha-sim", &args.podha_sim])
        .args(["--timeout", "3m", "--settle-timeout", "2m"])
        .arg("--out")
        .arg(&args.out);
    if let Some(dir) = &args.sim_dir {
        cmd.arg("--sim-dir").arg(dir);
    }
    if let Some(restore) = &args.restore {
        cmd.args(["--restore", restore]);
    }
    if let Some(check) = &args.check {
        cmd.args(["--check", check]);
    }
    if let Some(context) = &args.context {
        cmd.args(["--context", context]);
    }
    if args.yes {
        cmd.arg("--yes");
    }
    if args.expect == chaos::Expect::Held {
        cmd.args(["--expect", "held", "--hold"])
            .arg(format!("{}s", args.hold.as_secs()));
    }
    // No terminal: without --yes, podha chaos must refuse.
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context("running podha chaos")?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!(
        "[{}] podha chaos exited with {:?}\n{stdout}{stderr}",
        args.namespace,
        out.status.code()
    );
    Ok((out.status.code(), stdout, stderr))
}

async fn create_db(client: &kube::Client, ns: &str, nodes: &[&str]) -> anyhow::Result<()> {
    create_namespace(client, ns).await?;
    let sts: StatefulSet = serde_json::from_value(statefulset("db", nodes))?;
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sts)
        .await?;
    Ok(())
}

/// Fast detection: the Lease alone, probed every second, three failures, a grace just above
/// kwok's 10 s renew interval. Not `KubeletTCP`: a restarted sim node may have to take another
/// port when a second sim cluster on this machine holds its address's 10250, and a probe of the
/// old port then reaches that cluster's node (seen with concurrent test runs).
fn fast_detection() -> serde_json::Value {
    json!({
        "interval": "1s",
        "failureThreshold": 3,
        "signals": ["Lease"],
        "leaseGracePeriod": "12s",
        // Unused without KubeletTCP, but must be shorter than the interval.
        "tcpTimeout": "500ms",
    })
}

fn namespaces(names: &[&str]) -> serde_json::Value {
    json!({"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": names}
    ]})
}

async fn scenarios(cluster: &Cluster, out_dir: &Path) -> anyhow::Result<()> {
    let podha_sim = sim_exe()?;
    let client = cluster.client().await?;
    let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/podha.io_podhapolicies.yaml");
    install_crd(&client, &crd).await?;
    apply_policy(
        &client,
        "chaos-fast",
        json!({
            "namespaceSelector": namespaces(&["chaos-pass", "chaos-deploy", "chaos-decoy"]),
            "detection": fast_detection(),
            "action": "OutOfServiceTaint",
            // kwok nodes run no agent: the taint on the judgement alone, chosen explicitly.
            "fencing": { "proof": "None" },
            // Faults one after another, each node back before the next: each must be acted on,
            // which the default 10 min unhealthyWindow would hold from the second on.
            "safety": { "unhealthyWindow": "0s" },
        }),
    )
    .await?;
    apply_policy(
        &client,
        "chaos-other-driver",
        json!({
            "namespaceSelector": namespaces(&["chaos-driver"]),
            "volumes": { "drivers": ["other.csi.example.com"] },
            "fencing": { "proof": "None" },
        }),
    )
    .await?;
    let mut podha = Operator::start(Path::new(env!("CARGO_BIN_EXE_podha")), cluster)?;
    podha.wait_ready(Duration::from_secs(60)).await?;
    for ns in ["chaos-pass", "chaos-decoy"] {
        create_db(&client, ns, &FAULTED).await?;
    }
    for ns in ["chaos-unselected", "chaos-driver"] {
        create_db(&client, ns, &JUDGED).await?;
    }
    create_namespace(&client, "chaos-deploy").await?;
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        serde_json::from_value(pvc("data", podha_sim::csi::RWO_STORAGE_CLASS))?;
    Api::namespaced(client.clone(), "chaos-deploy")
        .create(&PostParams::default(), &claim)
        .await?;
    let web: k8s_openapi::api::apps::v1::Deployment =
        serde_json::from_value(deployment("web", &FAULTED, Some("data")))?;
    Api::namespaced(client.clone(), "chaos-deploy")
        .create(&PostParams::default(), &web)
        .await?;
    let sim_dir = cluster.dir().to_path_buf();
    let sim = |ns: &str, fault: &str| args(ns, fault, out_dir, &sim_dir, &podha_sim);

    // Clear errors before anything is touched.
    let bad_kubeconfig = out_dir.join("not-a-kubeconfig");
    std::fs::write(&bad_kubeconfig, "this is not yaml: [")?;
    let (code, _, stderr) = podha_chaos(&ChaosArgs {
        kubeconfig: Some(bad_kubeconfig.clone()),
        ..sim("chaos-pass", "sim-kill")
    })?;
    ensure!(
        code == Some(2) && stderr.contains(&format!("kubeconfig {}", bad_kubeconfig.display())),
        "a broken kubeconfig must be named, got {code:?}: {stderr}"
    );
    let (code, _, stderr) = podha_chaos(&ChaosArgs {
        statefulset: Some("nope".into()),
        ..sim("chaos-pass", "sim-kill")
    })?;
    ensure!(
        code == Some(2) && stderr.contains("statefulset chaos-pass/nope does not exist"),
        "a missing workload must be named, got {code:?}: {stderr}"
    );

    let (code, _, stderr) =
        podha_chaos(&sim("chaos-pass", "echo no such node {node} >&2; exit 7"))?;
    ensure!(
        code == Some(2) && stderr.contains("(exit code 7): no such node node-"),
        "a failing fault command must be reported with its exit code and stderr, got {code:?}: \
         {stderr}"
    );

    // Without --yes and without a terminal to say yes on, nothing is faulted; the refusal
    // names the cluster, the workload and the fault.
    let marker = out_dir.join("faulted-without-a-yes");
    let (code, _, stderr) = podha_chaos(&ChaosArgs {
        yes: false,
        ..sim("chaos-pass", &format!("touch {}", marker.display()))
    })?;
    ensure!(
        code == Some(2)
            && stderr.contains("pass --yes")
            && stderr.contains("statefulset chaos-pass/db")
            && stderr.contains("on context ")
            && stderr.contains("touch "),
        "a run without --yes and without a terminal must be refused, naming what it would do, \
         got {code:?}: {stderr}"
    );
    ensure!(!marker.exists(), "the fault ran without a yes");
    // The workload's own check fails before the fault: nothing is faulted, the check's words
    // are shown.
    let (code, _, stderr) = podha_chaos(&ChaosArgs {
        check: Some("echo {pod} is not whole >&2; exit 1".into()),
        ..sim("chaos-pass", &format!("touch {}", marker.display()))
    })?;
    ensure!(
        code == Some(2)
            && stderr.contains("check before the fault FAILED")
            && stderr.contains("db-0 is not whole")
            && stderr.contains("faulted nothing"),
        "a check failing before the fault must end the run, got {code:?}: {stderr}"
    );
    ensure!(!marker.exists(), "the fault ran after the check failed");
    // A context the kubeconfig does not have is named, not replaced by the current one.
    let (code, _, stderr) = podha_chaos(&ChaosArgs {
        context: Some("no-such-context".into()),
        ..sim("chaos-pass", "sim-kill")
    })?;
    ensure!(
        code == Some(2) && stderr.contains("no-such-context"),
        "an unknown --context must be refused naming it, got {code:?}: {stderr}"
    );

    // Refused before any fault, naming the rule.
    let (code, _, stderr) = podha_chaos(&sim("chaos-unselected", "sim-kill"))?;
    ensure!(
        code == Some(2)
            && stderr.contains("podha would not move chaos-unselected/db-0: no PodHAPolicy selects namespace chaos-unselected"),
        "an unselected namespace must be refused with exit code 2, got {code:?}: {stderr}"
    );
    let (code, _, stderr) = podha_chaos(&sim("chaos-driver", "sim-kill"))?;
    ensure!(
        code == Some(2) && stderr.contains("policy chaos-other-driver: DriverNotSelected"),
        "a policy whose drivers leave the volume out must be refused naming the rule, got \
         {code:?}: {stderr}"
    );
    for ns in ["chaos-unselected", "chaos-driver"] {
        ensure!(
            !out_dir.join(format!("{ns}.json")).exists(),
            "a refused run writes no results"
        );
    }

    // Two passing trials through the library, the node restored in between, in the
    // kubeconfig's context named.
    let kubeconfig = kube::config::Kubeconfig::read_from(sim_dir.join("kubeconfig"))?;
    let pass = ChaosArgs {
        trials: 2,
        context: kubeconfig.current_context,
        check: Some("echo checking; echo {pod} on {node} whole".into()),
        ..sim("chaos-pass", "sim-kill")
    };
    let mut progress = |line: &str| eprintln!("[chaos-pass] {line}");
    let outcome = chaos::execute(&pass, &mut progress).await;
    if let Some(e) = outcome.error {
        bail!("the passing run could not run: {e}");
    }
    let run = outcome.run;
    let violations = run.violations();
    ensure!(violations.is_empty(), "violations: {violations:?}");
    ensure!(
        run.records.len() == 2,
        "{} trials recorded",
        run.records.len()
    );
    let mut faulted = Vec::new();
    for r in &run.records {
        let t = &r.timeline;
        ensure!(
            t.at("taint").is_some() && t.recovered.is_some(),
            "trial {}: podha's taint and the recovery must be seen: {t:?}",
            r.trial
        );
        let restore = r.restore.as_ref().context("a restore ran")?;
        ensure!(restore.taint_gone.is_some(), "{restore:?}");
        let said: Vec<&str> = r
            .checks
            .iter()
            .filter_map(|c| c.result.as_deref().ok())
            .collect();
        let whole = format!("db-0 on {} whole", t.node);
        ensure!(
            said == [whole.as_str(), whole.as_str()],
            "the check runs before the fault and after the trial, placeholders expanded, its \
             last line kept: {:?}",
            r.checks
        );
        faulted.push(t.node.clone());
    }
    ensure!(
        faulted[0] != faulted[1],
        "the second trial faults the node the pod moved to: {faulted:?}"
    );
    let table = chaos::report::table(&run);
    ensure!(table.lines().count() == 3, "{table}");
    let (json_path, svg_path) = chaos::write_outputs(&pass, &run)?;
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path)?)?;
    ensure!(doc["passed"] == true && doc["trials"].as_array().map(Vec::len) == Some(2));
    let svg = std::fs::read_to_string(&svg_path)?;
    ensure!(svg.starts_with("<svg") && svg.contains("trial 2 "), "{svg}");

    // A Deployment: its replacement has another name and mounts the same claim.
    let deploy = ChaosArgs {
        statefulset: None,
        deployment: Some("web".into()),
        ..sim("chaos-deploy", "sim-kill")
    };
    let mut progress = |line: &str| eprintln!("[chaos-deploy] {line}");
    let outcome = chaos::execute(&deploy, &mut progress).await;
    if let Some(e) = outcome.error {
        bail!("the Deployment run could not run: {e}");
    }
    let violations = outcome.run.violations();
    ensure!(violations.is_empty(), "violations: {violations:?}");
    let record = outcome.run.records.first().context("one trial")?;
    ensure!(
        record.pod.starts_with("chaos-deploy/web-") && record.timeline.recovered.is_some(),
        "{record:?}"
    );

    // A trial expected to hold: passes when podha leaves a live node alone through the hold,
    // fails naming the invariant when it moves the pod off a dead one.
    let hold = |fault: &str| ChaosArgs {
        expect: chaos::Expect::Held,
        hold: Duration::from_secs(25),
        restore: Some("true".into()),
        ..sim("chaos-pass", fault)
    };
    let (code, stdout, stderr) = podha_chaos(&hold("true"))?;
    ensure!(
        code == Some(0) && stdout.contains("held 25s") && stderr.contains("podha held for 25s"),
        "a live node must be held, got {code:?}:\n{stdout}\n{stderr}"
    );
    let (code, stdout, stderr) = podha_chaos(&ChaosArgs {
        restore: Some("{podha_sim} node start {node} --dir {sim_dir}".into()),
        ..hold("sim-kill")
    })?;
    ensure!(
        code == Some(1)
            && stderr.contains("trial 1: held violated: podha acted on node-")
            && stdout.contains("FAILED: held"),
        "a dead node podha moves a pod off must break the hold, got {code:?}:\n{stdout}\n{stderr}"
    );

    // A fault command that also deletes a pod podha must leave alone.
    let node = wait_for(
        "chaos-decoy/db-0 on a node",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let pods: Api<k8s_openapi::api::core::v1::Pod> =
                    Api::namespaced(client, "chaos-decoy");
                Ok(pods.get_opt("db-0").await?.and_then(|p| p.spec?.node_name))
            }
        },
    )
    .await?;
    let decoy: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": "decoy", "namespace": "chaos-decoy" },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "app", "image": "registry.invalid/podha/app:1" }],
        },
    }))?;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "chaos-decoy")
        .create(&PostParams::default(), &decoy)
        .await?;
    let kubectl = cluster.bin_dir().join("kubectl");
    let fault = format!(
        "{{podha_sim}} node kill {{node}} --dir {{sim_dir}} && {} --kubeconfig {} -n \
         {{namespace}} delete pod decoy --force --grace-period=0",
        kubectl.display(),
        cluster.kubeconfig_path().display()
    );
    let decoy_args = ChaosArgs {
        restore: Some("{podha_sim} node start {node} --dir {sim_dir}".into()),
        ..sim("chaos-decoy", &fault)
    };
    let (code, stdout, stderr) = podha_chaos(&decoy_args)?;
    ensure!(
        code == Some(1)
            && stderr.contains("trial 1: bystanders-kept violated: pod chaos-decoy/decoy")
            && stderr.contains("NoControllerOwner"),
        "the lost decoy must fail the run naming the invariant, got {code:?}:\n{stdout}\n{stderr}"
    );
    ensure!(
        stdout.contains("FAILED: bystanders-kept"),
        "the table shows it: {stdout}"
    );
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&decoy_args.out)?)?;
    ensure!(
        doc["passed"] == false
            && doc["trials"][0]["violations"][0]["invariant"] == "bystanders-kept",
        "{doc}"
    );
    podha.alive()?;
    Ok(())
}

#[test]
fn podha_chaos_on_the_sim_cluster() {
    let shared = SharedCluster::new(env!("CARGO_TARGET_TMPDIR"), "podha-chaos", 3, None);
    let out_dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-out-{}", std::process::id()));
    let result = (|| -> anyhow::Result<()> {
        std::fs::create_dir_all(&out_dir)?;
        let cluster = shared.get().map_err(anyhow::Error::msg)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(scenarios(cluster, &out_dir))
    })();
    shared.teardown(result.is_err());
    if let Err(e) = result {
        panic!("{e:#}\n(results in {})", out_dir.display());
    }
}

//! `podha chaos`: fault a workload's node N times on any cluster and check that podha fails it
//! over as promised. Each trial records the failover's timeline through the API (the same
//! measurement the benchmark and the demo use, in [`timeline`]) and checks invariants
//! ([`invariants`]); the run ends with a table, a JSON file and an SVG picture ([`report`]).
//!
//! Modules: `faults` (command templates), `preflight` (podha's own rules: would it move the
//! pod, which pods must stay), `trial` (one trial against the cluster), `invariants`, `report`,
//! `timeline`.

pub mod data;
pub mod faults;
pub mod invariants;
pub mod own_check;
pub mod preflight;
pub mod report;
pub mod timeline;
mod trial;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::Selector;
use kube::{Api, Client};

pub use faults::Fault;
pub use invariants::Expect;
pub use report::Run;
use trial::{Workload, restore_node, run_trial};

/// Why a chaos run could not run (a violated invariant is a result, not an error).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Connect(#[from] crate::kubeconfig::ConnectError),
    #[error("{kind} {namespace}/{name} does not exist")]
    WorkloadNotFound {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error(
        "the PodHAPolicy CRD is not installed: install podha first (helm chart, or `podha crd | kubectl apply -f -`)"
    )]
    NoCrd,
    /// `reason`: the first rule `podha explain` fails the pod on.
    #[error("podha would not move {pod}: {reason} (`podha explain pod {pod}` says more)")]
    NotMovable { pod: String, reason: String },
    #[error(
        "{workload} has no pod Running and Ready with all its volumes attached after {}s",
        waited.as_secs()
    )]
    NotSettled { workload: String, waited: Duration },
    #[error("command `{command}` failed ({status}){}", stderr_suffix(stderr))]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// The workload's own check failed before trial `trial`'s fault: nothing was faulted.
    #[error("{summary}: trial {trial} faulted nothing")]
    CheckFailedBefore { trial: usize, summary: String },
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl From<crate::explain::ReadError> for Error {
    fn from(e: crate::explain::ReadError) -> Self {
        match e {
            crate::explain::ReadError::NoCrd => Error::NoCrd,
            other => Error::Usage(other.to_string()),
        }
    }
}

impl Error {
    fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            what: what.into(),
            source,
        }
    }
}

/// `podha chaos`'s options.
#[derive(clap::Args, Clone, Debug)]
#[command(group(clap::ArgGroup::new("workload").required(true).args(["statefulset", "deployment"])))]
pub struct ChaosArgs {
    /// Kubeconfig file; without it, $KUBECONFIG / ~/.kube/config or in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Fault without asking. Otherwise podha chaos names the cluster, the workload and the
    /// fault and waits for `yes` on the terminal, and without a terminal it faults nothing.
    #[arg(long)]
    pub yes: bool,
    /// Namespace of the workload.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// The StatefulSet whose pod's node is faulted.
    #[arg(long)]
    pub statefulset: Option<String>,
    /// The Deployment whose pod's node is faulted.
    #[arg(long)]
    pub deployment: Option<String>,
    /// How many trials, one after another.
    #[arg(long, default_value_t = 1)]
    pub trials: usize,
    /// The fault: a built-in name (kind-kill, kind-freeze, kind-partition, sim-kill,
    /// sim-kill-kubelet, sim-freeze, sim-isolate, sim-partition) or a shell command template with {node},
    /// {namespace}, {pod}, {volume}, {sim_dir}, {podha_sim}, e.g. 'docker kill {node}'.
    #[arg(long)]
    pub fault: String,
    /// Command template that brings the node back (default: the built-in fault's own; for a
    /// built-in fault, {restore} in it is the built-in's, e.g. '{restore} && ./wait-for-net').
    /// Without one, the check that podha's taint goes away is skipped.
    #[arg(long)]
    pub restore: Option<String>,
    /// What the trial did to the data: a command template printing a JSON object with the
    /// arrays `split_brain_writes` and `lost_acknowledged_writes` (as `podha-csi check` does),
    /// run after the node is restored and --data-settle has passed; or the built-in
    /// `podha-csi-sim` (podha-csi on the sim cluster). Placeholders as for --fault, and
    /// {volume} (the pod's volume handle) and {podha_csi}. Without it the invariants
    /// no-split-brain and no-lost-writes are not checked.
    #[arg(long)]
    pub data_check: Option<String>,
    /// The workload's own check: a command template (placeholders as for --fault) that exits 0
    /// when the application's data is whole, e.g. a database's consistency check. It runs
    /// before each trial's fault (a failure there ends the run, nothing faulted) and after the
    /// trial, once the node is restored and the data check has run (a failure fails the trial:
    /// invariant check-passes). Its last line of output is shown and kept in the results.
    #[arg(long)]
    pub check: Option<String>,
    /// How long the check may take before it counts as failed.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub check_timeout: Duration,
    /// How long writers may go on after the restore (or the failover, without one) before the
    /// data check: a node that was frozen or cut off writes again in that time, if it can.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub data_settle: Duration,
    /// The podha-csi executable, for {podha_csi}.
    #[arg(long, default_value = "podha-csi")]
    pub podha_csi: String,
    /// The sim cluster's directory, for {sim_dir} (the sim-* faults, podha-csi-sim).
    #[arg(long)]
    pub sim_dir: Option<PathBuf>,
    /// The podha-sim executable, for {podha_sim}.
    #[arg(long, default_value = "podha-sim")]
    pub podha_sim: String,
    /// What podha should do about the fault: move the pod (a replacement runs elsewhere with
    /// its volumes), or hold (take no action, the pod stays) through --hold, as for a fault it
    /// must not tell from a live node.
    #[arg(long, value_enum, default_value_t = Expect::Moved)]
    pub expect: Expect,
    /// With --expect held: how long after the fault podha must not act.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub hold: Duration,
    /// How long a trial may take, from the fault, before it counts as not recovered.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How long to wait for the workload to run before a trial, and for the node to come back
    /// without podha's taint after the restore.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub settle_timeout: Duration,
    /// Where the JSON results go.
    #[arg(long, default_value = "podha-chaos.json")]
    pub out: PathBuf,
    /// Where the SVG picture goes (default: next to --out, with .svg).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// The namespace podha runs in (default: the one holding its leader Lease).
    #[arg(long)]
    pub podha_namespace: Option<String>,
    /// The name of podha's leader Lease (the chart's leaderElection.leaseName).
    #[arg(long, default_value = crate::leader::DEFAULT_LEASE_NAME)]
    pub leader_lease: String,
}

impl ChaosArgs {
    pub fn svg_path(&self) -> PathBuf {
        self.svg
            .clone()
            .unwrap_or_else(|| self.out.with_extension("svg"))
    }
}

/// What a run produced: the trials that ran, and the error that stopped it, if any.
#[derive(Debug)]
pub struct Outcome {
    pub run: Run,
    pub error: Option<Error>,
}

async fn workload(client: &Client, args: &ChaosArgs) -> Result<Workload, Error> {
    let ns = args.namespace.clone();
    let (kind, name, selector) = match (&args.statefulset, &args.deployment) {
        (Some(name), None) => {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
            let sts = api
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("reading statefulset {ns}/{name}"), e))?;
            (
                "statefulset",
                name,
                sts.and_then(|s| Some(s.spec?.selector)),
            )
        }
        (None, Some(name)) => {
            let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            let deploy = api
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("reading deployment {ns}/{name}"), e))?;
            (
                "deployment",
                name,
                deploy.and_then(|d| Some(d.spec?.selector)),
            )
        }
        _ => {
            return Err(Error::Usage(
                "give exactly one of --statefulset and --deployment".into(),
            ));
        }
    };
    let selector: LabelSelector = selector.ok_or_else(|| Error::WorkloadNotFound {
        kind,
        namespace: ns.clone(),
        name: name.clone(),
    })?;
    let selector = Selector::try_from(selector)
        .map_err(|e| Error::Usage(format!("{kind} {ns}/{name} has a bad selector: {e}")))?;
    Ok(Workload {
        kind,
        namespace: ns,
        name: name.clone(),
        selector,
    })
}

/// Runs the trials one after another; stops at the first trial that cannot run.
pub async fn execute(args: &ChaosArgs, progress: &mut dyn FnMut(&str)) -> Outcome {
    let fault = Fault::new(&args.fault, args.restore.as_deref());
    let mut run = Run {
        workload: String::new(),
        fault: fault.name.clone(),
        records: Vec::new(),
    };
    let result = async {
        if args.trials == 0 {
            return Err(Error::Usage("--trials must be at least 1".into()));
        }
        let (client, target) = crate::kubeconfig::reachable_target(
            args.kubeconfig.as_deref(),
            args.context.as_deref(),
        )
        .await?;
        let workload = workload(&client, args).await?;
        run.workload = workload.to_string();
        confirm(args, &target, &workload, &fault)?;
        for k in 1..=args.trials {
            let (mut record, after) =
                run_trial(&client, args, &fault, &workload, k, progress).await?;
            // A restore that fails still leaves the trial's failover in the results.
            if let Some(command) = after.restore {
                match restore_node(&client, args, &record, command, progress).await {
                    Ok(restored) => record.restore = Some(restored),
                    Err(e) => {
                        run.records.push(record);
                        return Err(e);
                    }
                }
            }
            if let Some(command) = after.data_check {
                progress(&format!(
                    "trial {k}/{}: data check in {:.0?}: {command}",
                    args.trials, args.data_settle
                ));
                tokio::time::sleep(args.data_settle).await;
                let checked = data::run(command).await;
                progress(&format!(
                    "trial {k}/{}: {}",
                    args.trials,
                    report::data_cell(&Some(checked.clone()))
                ));
                record.data = Some(checked);
            }
            if let Some(command) = after.check {
                let checked =
                    own_check::run(own_check::When::After, command, args.check_timeout).await;
                progress(&format!("trial {k}/{}: {}", args.trials, checked.summary()));
                record.checks.push(checked);
            }
            run.records.push(record);
        }
        Ok(())
    }
    .await;
    Outcome {
        run,
        error: result.err(),
    }
}

/// What the run is about to do, said before it does it: `Ok` with `--yes`, or once a person
/// typed `yes` on the terminal. Without a terminal (a script, CI) and without `--yes`, refused:
/// a fault injector must not run on whatever cluster the current context happens to name.
fn confirm(
    args: &ChaosArgs,
    target: &crate::kubeconfig::Target,
    workload: &Workload,
    fault: &Fault,
) -> Result<(), Error> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if args.yes {
        return Ok(());
    }
    let sim = args
        .sim_dir
        .as_ref()
        .map(|dir| format!(" and the sim cluster in {}", dir.display()))
        .unwrap_or_default();
    let plan = format!(
        "about to fault the node of a pod of {workload} {} time(s), with `{}`, on {target}{sim}",
        args.trials, fault.inject
    );
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Error::Usage(format!(
            "{plan}: no terminal to confirm on, so nothing was faulted; pass --yes to run \
             without asking"
        )));
    }
    eprint!("podha chaos is {plan}.\nType yes to go on: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Error::Usage(format!("reading the answer: {e}")))?;
    if answer.trim() == "yes" {
        Ok(())
    } else {
        Err(Error::Usage("not confirmed: nothing was faulted".into()))
    }
}

/// Writes the JSON and SVG files; returns their paths.
pub fn write_outputs(args: &ChaosArgs, run: &Run) -> Result<(PathBuf, PathBuf), Error> {
    let svg_path = args.svg_path();
    for (path, text) in [
        (&args.out, report::json(run)),
        (&svg_path, report::svg(run)),
    ] {
        std::fs::write(path, text).map_err(|source| Error::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok((args.out.clone(), svg_path))
}

/// The whole command: progress on stderr, the table on stdout, the files written. Exit code 0
/// when every invariant held, 1 when one was violated, 2 when the run could not run.
pub async fn cli(args: ChaosArgs) -> ExitCode {
    let mut progress = |line: &str| eprintln!("{line}");
    let outcome = execute(&args, &mut progress).await;
    if !outcome.run.records.is_empty() {
        print!("{}", report::table(&outcome.run));
        match write_outputs(&args, &outcome.run) {
            Ok((json, svg)) => println!("results: {} and {}", json.display(), svg.display()),
            Err(e) => eprintln!("podha chaos: {e}"),
        }
    }
    if let Some(e) = &outcome.error {
        eprintln!("podha chaos: {e}");
        return ExitCode::from(2);
    }
    let violations = outcome.run.violations();
    if violations.is_empty() {
        println!(
            "every invariant held in {} trial(s)",
            outcome.run.records.len()
        );
        ExitCode::SUCCESS
    } else {
        for (trial, v) in &violations {
            eprintln!(
                "podha chaos: trial {trial}: {} violated: {}",
                v.invariant, v.reason
            );
        }
        ExitCode::from(1)
    }
}

//! Runs the operator under exactly the chart's RBAC: the chart's ServiceAccount, ClusterRole,
//! Roles and bindings, rendered by `helm template` (so what a user installs is what is tested),
//! are applied to the sim cluster, and the operator authenticates with a token of that
//! ServiceAccount. A verb missing from the chart then fails the scenario that needs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use crate::cluster::Cluster;

/// The Helm release name the e2e suite renders the chart as (its objects are named `podha`).
pub const RELEASE: &str = "podha";

/// The templates holding the operator's identity and permissions.
const RBAC_TEMPLATES: [&str; 5] = [
    "templates/serviceaccount.yaml",
    "templates/clusterrole.yaml",
    "templates/clusterrolebinding.yaml",
    "templates/role.yaml",
    "templates/rolebinding.yaml",
];

/// helm, from `$PODHA_HELM` (`make test` sets it to the binary `make helm` builds).
pub fn helm_path() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PODHA_HELM")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .context("PODHA_HELM is not set: run `make helm` and set PODHA_HELM to the helm it built (make test does both)")?;
    if !path.is_file() {
        bail!(
            "PODHA_HELM={} does not exist: run `make helm`",
            path.display()
        );
    }
    Ok(path)
}

/// The templates holding the agent's identity and permissions, and the admission policies that
/// bind each write podha trusts to its writer.
const AGENT_TEMPLATES: [&str; 2] = [
    "templates/agent-rbac.yaml",
    "templates/admission-policies.yaml",
];

/// The chart's `templates` for release [`RELEASE`] in `namespace`, as `helm template` renders
/// them for Kubernetes `kube_version` (checked against the chart's `kubeVersion`) with the
/// values `sets` (`key=value`).
pub fn render(
    helm: &Path,
    chart: &Path,
    kube_version: &str,
    namespace: &str,
    sets: &[String],
    templates: &[&str],
) -> anyhow::Result<String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE]).arg(chart).args([
        "--namespace",
        namespace,
        "--kube-version",
        kube_version,
    ]);
    for set in sets {
        cmd.arg(format!("--set={set}"));
    }
    for t in templates {
        cmd.args(["--show-only", t]);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !out.status.success() {
        bail!(
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Applies the chart's RBAC for `namespace` to `cluster` (as admin, with kubectl) and returns
/// `admin` changed to authenticate as the chart's ServiceAccount instead, with a token from
/// the TokenRequest API. `values` are more `--set`s for the chart (`rbac.bmcSecrets=true`).
pub fn service_account_config(
    cluster: &Cluster,
    helm: &Path,
    chart: &Path,
    namespace: &str,
    lease_name: &str,
    values: &[&str],
    admin: &kube::Config,
) -> anyhow::Result<kube::Config> {
    let mut set = vec![format!("leaderElection.leaseName={lease_name}")];
    set.extend(values.iter().map(|v| v.to_string()));
    let manifest = render(
        helm,
        chart,
        &kube_version(cluster)?,
        namespace,
        &set,
        &RBAC_TEMPLATES,
    )?;
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        if !manifest.lines().any(|l| l == format!("kind: {kind}")) {
            bail!("the chart rendered no {kind}:\n{manifest}");
        }
    }
    kubectl(cluster, &["apply", "-f", "-"], Some(&manifest))?;
    let token = kubectl(
        cluster,
        &[
            "create",
            "token",
            RELEASE,
            "-n",
            namespace,
            "--duration=24h",
        ],
        None,
    )?;
    let mut config = admin.clone();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.trim().to_string().into()),
        ..kube::config::AuthInfo::default()
    };
    Ok(config)
}

/// Applies to `cluster` (as admin, with kubectl) the chart's RBAC, the agent's and the admission
/// policies for `namespace`, rendered with the agent on and the values `sets`.
pub fn apply_agent_policies(
    cluster: &Cluster,
    helm: &Path,
    chart: &Path,
    namespace: &str,
    sets: &[String],
) -> anyhow::Result<()> {
    let mut values = vec!["agent.enabled=true".to_string()];
    values.extend_from_slice(sets);
    let templates: Vec<&str> = RBAC_TEMPLATES
        .iter()
        .chain(&AGENT_TEMPLATES)
        .copied()
        .collect();
    let manifest = render(
        helm,
        chart,
        &kube_version(cluster)?,
        namespace,
        &values,
        &templates,
    )?;
    if !manifest
        .lines()
        .any(|l| l == "kind: ValidatingAdmissionPolicy")
    {
        bail!("the chart rendered no ValidatingAdmissionPolicy:\n{manifest}");
    }
    kubectl(cluster, &["apply", "-f", "-"], Some(&manifest))?;
    Ok(())
}

/// The API server's version (`v1.34.4`), as helm's `--kube-version` takes it.
fn kube_version(cluster: &Cluster) -> anyhow::Result<String> {
    let version: serde_json::Value =
        serde_json::from_str(&kubectl(cluster, &["version", "-o", "json"], None)?)?;
    version["serverVersion"]["gitVersion"]
        .as_str()
        .map(str::to_string)
        .context("kubectl version printed no serverVersion.gitVersion")
}

fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut child = Command::new(cluster.bin_dir().join("kubectl"))
        .arg(format!(
            "--kubeconfig={}",
            cluster.kubeconfig_path().display()
        ))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

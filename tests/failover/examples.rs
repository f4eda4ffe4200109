//! The policies in `examples/` against the sim's API server: each one is accepted as written
//! (the CRD's schema, with unknown fields refused, and its CEL rules), and is stored with
//! every field it sets. The folder must hold the policy of each platform the docs point to
//! (docs/proofs.md, README), so that none can go missing unnoticed.
//!
//! A policy is cluster-scoped and podha's replicas act on every one they see: each example is
//! applied once as a server-side dry run exactly as written, then created for real (named
//! after the scenario's namespace) with a `nodeSelector` that selects no node, so that no
//! other scenario's nodes or pods ever follow it, read back and deleted.

use anyhow::{Context as _, anyhow, ensure};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{Value, json};

use super::{Failed, Operators, PodHAPolicy, SharedCluster, log, secs_};
use podha_sim::examples::{example_files, fields_not_kept, read_example};
use podha_sim::testkit::*;

/// The field manager of the test's applies.
const MANAGER: &str = "podha-examples-test";

/// The API server's refusal, in its own words.
fn refusal(e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(status) => anyhow!(
            "the API server refused it ({} {}): {}",
            status.code,
            status.reason,
            status.message
        ),
        other => anyhow!("the request failed: {other}"),
    }
}

/// Applies the example named `name` (dry run as written, then for real on no node), reads it
/// back and deletes it.
async fn apply_example(
    api: &Api<DynamicObject>,
    name: &str,
    written: &Value,
) -> anyhow::Result<()> {
    let mut policy = written.clone();
    policy["metadata"] = json!({ "name": name });
    let strict = PatchParams::apply(MANAGER).validation_strict();
    api.patch(name, &strict.clone().dry_run(), &Patch::Apply(&policy))
        .await
        .map_err(refusal)
        .context("applied as written (server-side dry run)")?;

    policy["spec"]["nodeSelector"] =
        json!({ "matchLabels": { "podha.io/examples-test": "selects-no-node" } });
    api.patch(name, &strict, &Patch::Apply(&policy))
        .await
        .map_err(refusal)
        .context("applied on no node")?;
    let read = api.get(name).await.map_err(refusal).context("read back");
    let deleted = api
        .delete(name, &DeleteParams::default())
        .await
        .map_err(refusal)
        .context("deleted");
    let read = read?;
    deleted?;

    let mut spec = written["spec"].clone();
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("nodeSelector");
    }
    let mut missing = Vec::new();
    fields_not_kept(
        "spec",
        &spec,
        &read.data["spec"],
        &|w, r| w == r,
        &mut missing,
    );
    ensure!(
        missing.is_empty(),
        "the API server did not store it as written: {}; stored spec: {}",
        missing.join("; "),
        read.data["spec"]
    );
    wait_for(&format!("policy {name} gone"), secs_(30), || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

pub fn accepted_as_written(shared: &SharedCluster, _: &Operators) -> Result<(), Failed> {
    run_scenario(shared, "examples", |ctx| async move {
        // The CRD as the chart installs it (the other scenarios' replicas may not have yet).
        let crd = podha_sim::chart_install::chart_dir().join("crds/podha.io_podhapolicies.yaml");
        podha_sim::failover::install_crd(&ctx.client, &crd).await?;
        let api: Api<DynamicObject> =
            Api::all_with(ctx.client.clone(), &ApiResource::erase::<PodHAPolicy>(&()));
        let files = example_files()?;
        for path in &files {
            let file = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stem = file.trim_end_matches(".yaml").trim_end_matches(".yml");
            let name = format!("{}-{stem}", ctx.ns);
            let written = read_example(path).with_context(|| format!("examples/{file}"))?;
            apply_example(&api, &name, &written)
                .await
                .with_context(|| format!("examples/{file}"))?;
            log(
                &ctx.ns,
                format!("examples/{file}: accepted as written, stored with every field it sets"),
            );
        }
        Ok(())
    })
}

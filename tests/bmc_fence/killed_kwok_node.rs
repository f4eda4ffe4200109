//! A StatefulSet's kwok node is killed. Its policy judges nodes on the kubelet port alone and
//! takes the first of two confirmed proofs: a fence controller's acknowledgement (none runs)
//! or the BMC's `Off`. Its BMC Secret first points at a port where nothing listens, then at
//! another node's system (whose UUID is not the node's `systemUUID`), then holds a wrong
//! password: podha holds the node each time (nothing tainted) with a Warning `PowerOffFailed`
//! naming the cause (unreachable, not the node's system, the BMC's 401), and the other node's
//! machine stays on. The Secret is mended: podha, without a restart, has the BMC force the
//! machine off and taints the node only once the system says `Off` (read the moment the taint
//! shows); both proofs were asked for; the pod moves and runs with its volume on the other
//! node; no other system was powered off. With `powerCycle`, podha powers the machine on once
//! the failover is done: the node boots, and podha takes its taint off.

use k8s_openapi::api::apps::v1::StatefulSet;
use podha::chaos::timeline::wait_settled;
use podha_sim::testkit::statefulset;

use super::*;

const APP_NS: &str = "bmc-fenced";
const PAIR: [&str; 2] = ["node-1", "node-2"];
/// A machine outside the policy, whose system a wrong Secret leads to.
const ELSEWHERE: &str = "node-3";

fn say(msg: impl AsRef<str>) {
    log(APP_NS, msg);
}

pub(super) fn held_then_powered_off(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, APP_NS, |ctx| async move {
        let admin = ctx.client.clone();
        let (access, secrets, podha) = start_podha(&ctx, &PAIR).await?;
        apply_bmc_policy(
            &admin,
            "bare-metal",
            json!({ "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": PAIR }
            ]}),
            APP_NS,
            // Judged on the kubelet port alone (a killed node's address answers nothing), so
            // only a confirmed proof may follow: a fence controller's acknowledgement or the
            // BMC's Off, whichever comes first. No controller runs: the BMC proves it.
            &["KubeletTCP"],
            Some(&["External", "BMC"]),
        )
        .await?;
        let sts: StatefulSet = serde_json::from_value(statefulset("db", &PAIR))?;
        Api::<StatefulSet>::namespaced(admin.clone(), APP_NS)
            .create(&PostParams::default(), &sts)
            .await?;
        let subject = wait_settled(&admin, APP_NS, "app=db", secs(180))
            .await?
            .context("db-0 did not run with its volume attached within 180s")?;
        let dead = subject.node.clone();
        let refuge = PAIR.into_iter().find(|n| *n != dead).unwrap_or("node-2");
        say(format!("db-0 runs on {dead}"));

        // Asked before the death, podha explain reaches the BMC.
        bmc_explained(&ctx, &dead, "pass", "PowerState On")?;
        // A BMC nobody answers at: podha explain says so before the death (from where it runs:
        // podha's pod may reach what it cannot), and the dead node is held, with the cause.
        let mut unreachable = bmc_secret(&access, &dead, &dead)?;
        set_key(&mut unreachable, "address", "https://127.0.0.1:1");
        replace_secret(&secrets, unreachable).await?;
        bmc_explained(&ctx, &dead, "note", "unreachable")?;
        ctx.cluster.kill_node(&dead)?;
        let killed = Instant::now();
        warned(&admin, &dead, "unreachable", secs(60)).await?;
        untainted_for(&admin, &dead, secs(3)).await?;
        say(format!(
            "{dead} held {:.1?} after its death: BMC unreachable",
            killed.elapsed()
        ));

        // Another machine's BMC in the dead node's Secret: its UUID is not the node's, so
        // podha refuses it, and that machine is not powered off.
        let mut elsewhere = bmc_secret(&access, &dead, &dead)?;
        set_key(&mut elsewhere, "systemId", ELSEWHERE);
        replace_secret(&secrets, elsewhere).await?;
        warned(&admin, &dead, "not node", secs(60)).await?;
        untainted_for(&admin, &dead, secs(3)).await?;
        ensure!(
            access.system(ELSEWHERE)?.power_state().await? == PowerState::On,
            "{ELSEWHERE}'s system was powered off through {dead}'s Secret"
        );
        say(format!(
            "{dead} held: its Secret leads to {ELSEWHERE}'s system"
        ));

        // A BMC that refuses podha's credentials (401): held, with the cause.
        let mut refused = bmc_secret(&access, &dead, &dead)?;
        set_key(&mut refused, "password", "not-the-password");
        replace_secret(&secrets, refused).await?;
        warned(&admin, &dead, "HTTP 401", secs(60)).await?;
        untainted_for(&admin, &dead, secs(3)).await?;
        ensure!(
            access.system(&dead)?.power_state().await? == PowerState::On,
            "{dead}'s system was powered off though podha could not log in"
        );
        say(format!("{dead} held: BMC answers 401"));

        // Mended: podha powers the machine off, and only then taints the node.
        replace_secret(&secrets, bmc_secret(&access, &dead, &dead)?).await?;
        let mended = Instant::now();
        let state = state_at_taint(&admin, &access, &dead, secs(90)).await?;
        ensure!(
            state == PowerState::Off,
            "{dead} was tainted while its system said {state}"
        );
        say(format!(
            "{dead} powered off and tainted {:.1?} after its Secret was mended",
            mended.elapsed()
        ));
        told_power_off(&admin, &dead).await?;
        // Both proofs were asked for: the fence controller on the Node too.
        let node = Api::<Node>::all(admin.clone()).get(&dead).await?;
        ensure!(
            kube::ResourceExt::annotations(&node)
                .contains_key(podha::contract::FENCE_REQUEST_ANNOTATION),
            "{dead} carries no fence request: anyOf asked only the BMC"
        );
        wait_for(
            &format!("db-0 running on {refuge} with its volume"),
            secs(120),
            || async {
                Ok(wait_settled(&admin, APP_NS, "app=db", secs(1))
                    .await?
                    .filter(|s| s.node == refuge && s.uid != subject.uid))
            },
        )
        .await?;
        say(format!("db-0 recovered on {refuge}"));
        others_on(&access, &dead).await?;

        // powerCycle: podha powers the machine on again; the node boots and podha takes its
        // taint off.
        wait_for(
            &format!("podha to take its taint off {dead}"),
            secs(120),
            || async { Ok((!has_taint(&admin, &dead).await?).then_some(())) },
        )
        .await?;
        let replacement: Pod = Api::namespaced(admin.clone(), APP_NS).get("db-0").await?;
        powered_on_after(&admin, &dead, ready_since(&replacement)?).await?;
        ensure!(access.system(&dead)?.power_state().await? == PowerState::On);
        say(format!("{dead} powered on by podha, booted and untainted"));
        ctx.remove_workloads(secs(120)).await?;
        podha.stop().await
    })
}

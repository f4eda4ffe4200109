//! A node that reboots while podha still judges it dead (its kubelet not heard yet) is coming
//! back: its new boot is asked for no fence, nor its BMC for a power-off. A reboot the Node's
//! boot ID alone shows proves no fence.

use super::fencing::{acknowledge, needs_agent, with_agent};
use super::*;

/// `node` reports boot `boot`.
fn booted(world: &mut World, node: &str, boot: &str) {
    let n = (*world.view.nodes[node]).clone().boot(boot);
    world.view.nodes.insert(node.into(), n.into());
}

#[test]
fn a_node_that_rebooted_since_it_was_judged_dead_is_asked_for_no_fence() {
    let mut world = World::new(with_agent(cluster(3), "node-1"));
    booted(&mut world, "node-1", "boot-1");
    let mut world = world.policy("p", needs_agent(mk_spec())).fail("node-1");
    assert_eq!(
        intent_names(&world.plan()),
        ["request fence node-1", "hold FencingPending"]
    );
    // It rebooted (its agent advertising again) before podha asked.
    booted(&mut world, "node-1", "boot-2");
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
}

/// The Node's boot ID is set (by anyone who may patch the Node's status) while its kubelet is
/// dead and the node runs on; podha asks the flipped boot for a fence; the boot ID is set back,
/// and the acknowledgement of the "earlier boot" is on the Node. Without the node's kubelet
/// renewing its Lease in the boot the Node reports, nothing shows a reboot: no proof, the node
/// is held. A real reboot (the kubelet renewing in the new boot) proves it.
#[test]
fn an_acknowledgement_of_another_boot_counts_only_once_the_node_renewed_in_its_boot() {
    let mut world = World::new(with_agent(cluster(3), "node-1"));
    booted(&mut world, "node-1", "boot-1");
    booted(&mut world, "node-1", "flipped");
    let mut world = world.policy("p", needs_agent(mk_spec())).fail("node-1");
    assert_eq!(
        intent_names(&world.plan()),
        ["request fence node-1", "hold FencingPending"]
    );
    let request = "p/1700000000000/flipped";
    world.ledger.record_fence_request("node-1", request);
    booted(&mut world, "node-1", "boot-1");
    acknowledge(&mut world, "node-1", request);
    // Its kubelet last renewed long before, in the boot the Node reports again.
    let renewed = world.t0 - Duration::from_secs(60);
    world
        .heartbeats
        .insert("node-1".into(), renewed_at(renewed));
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);

    let hb = world.heartbeats.get_mut("node-1").expect("inserted");
    hb.renewed_in_boot = true;
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"],
        "a boot the kubelet renews in"
    );
}

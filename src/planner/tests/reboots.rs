//! A node that reboots while podha still judges it dead (its kubelet not heard yet) is coming
//! back: its new boot is asked for no fence, nor its BMC for a power-off.

use super::fencing::{needs_agent, with_agent};
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

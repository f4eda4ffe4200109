//! The key this replica signs its heartbeats with, published on the leader Lease while it
//! leads ([`LEADER_KEY_ANNOTATION`]): the agents trust heartbeats signed by that key alone.
//!
//! One key per process, in memory: a replica that takes the Lease publishes its own. The write
//! is a merge patch of the annotation guarded by the Lease's `resourceVersion`, made only after
//! reading the Lease with this replica as its holder, so a replica that lost the Lease meanwhile
//! cannot put its key back over the new leader's (the write conflicts). While it leads, the
//! replica reads the Lease again every [`RECHECK`] and writes again if its key is not there.
//! The chart's admission policy lets only podha write that Lease.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{LeaderConfig, Leadership};
use crate::contract::{Identity, LEADER_KEY_ANNOTATION};

/// How often a leader checks that its key is on the Lease.
pub const RECHECK: Duration = Duration::from_secs(10);
/// How often a replica that does not lead looks whether it does, and how soon a failed write
/// is tried again: until the key is there, no agent believes this leader.
const SOON: Duration = Duration::from_millis(500);
/// How long a read or a write of the Lease may take (a connection that hangs must not hold the
/// key back for the whole term).
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Publishes `key` on `cfg`'s Lease whenever this replica leads, for as long as it runs.
pub async fn publish(
    leases: Api<Lease>,
    cfg: LeaderConfig,
    key: Arc<Identity>,
    leadership: Leadership,
) {
    let value = key.public().encode();
    // Whether this term of leadership has written its key yet (to say so once).
    let mut published = false;
    loop {
        if !leadership.may_write(Instant::now()) {
            published = false;
            tokio::time::sleep(SOON).await;
            continue;
        }
        let put = tokio::time::timeout(CALL_TIMEOUT, put(&leases, &cfg, &value, &leadership))
            .await
            .unwrap_or_else(|_| Err(Failed::TimedOut));
        let wait = if put.is_ok() { RECHECK } else { SOON };
        match put {
            Ok(Put::There) => {}
            Ok(Put::Written) if !published => {
                info!(key = %value, lease = %cfg.lease_name, "heartbeat key published on the leader Lease");
            }
            Ok(Put::Written) => {
                warn!(key = %value, "the leader Lease had lost this leader's key: published again")
            }
            Ok(Put::NotHolder) => debug!("the leader Lease names another holder: not publishing"),
            Err(e) => {
                warn!(error = %e, "cannot publish the heartbeat key on the leader Lease; agents will not trust this leader's heartbeats until it is")
            }
        }
        published = published || wait == RECHECK;
        tokio::time::sleep(wait).await;
    }
}

enum Put {
    There,
    Written,
    NotHolder,
}

#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer from the API server within {CALL_TIMEOUT:?}")]
    TimedOut,
}

async fn put(
    leases: &Api<Lease>,
    cfg: &LeaderConfig,
    value: &str,
    leadership: &Leadership,
) -> Result<Put, Failed> {
    let lease = leases.get(&cfg.lease_name).await?;
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    if holder != Some(cfg.identity.as_str()) {
        return Ok(Put::NotHolder);
    }
    let current = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEADER_KEY_ANNOTATION));
    if current.map(String::as_str) == Some(value) {
        return Ok(Put::There);
    }
    if !leadership.may_write(Instant::now()) {
        return Ok(Put::NotHolder);
    }
    let patch = json!({"metadata": {
        "resourceVersion": lease.metadata.resource_version,
        "annotations": {LEADER_KEY_ANNOTATION: value},
    }});
    leases
        .patch(
            &cfg.lease_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(Put::Written)
}

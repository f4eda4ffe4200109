//! The key podha's leader signs its heartbeats with, published on the leader Lease while it
//! leads ([`LEADER_KEY_ANNOTATION`]): the agents trust heartbeats signed by that key alone.
//!
//! One key for all of podha's replicas ([`shared`]), kept in a Secret of the release namespace
//! ([`secret_name`]) that the first replica creates: a new leader signs with the key the agents
//! already hold, so a leader change, even one that comes as the API server returns from an
//! outage, never waits for every agent to read a new key (an agent that had not yet would count
//! itself unheard while its peers are heard, and fence). To change the key, delete the Secret
//! and restart the replicas. The agents' keys are theirs alone; this one is podha's. The write
//! is a merge patch of the annotation guarded by the Lease's `resourceVersion`, made only after
//! reading the Lease with this replica as its holder, so a replica that lost the Lease meanwhile
//! cannot put its key back over the new leader's (the write conflicts). While it leads, the
//! replica reads the Lease again every [`RECHECK`] and writes again if its key is not there.
//! The chart's admission policy lets only podha write that Lease.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{LeaderConfig, Leadership};
use crate::contract::{Identity, KeyError, LEADER_KEY_ANNOTATION};

/// The key in the Secret's data.
const SECRET_KEY: &str = "pkcs8";

/// The Secret that holds the replicas' key: `<leader Lease>-heartbeat-key`, beside the Lease.
pub fn secret_name(cfg: &LeaderConfig) -> String {
    format!("{}-heartbeat-key", cfg.lease_name)
}

/// Why the replicas' key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SharedKeyError {
    #[error("reading or creating Secret {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "Secret {name} holds no Ed25519 key in `{SECRET_KEY}` ({why}); delete it to make a new one"
    )]
    Garbled { name: String, why: String },
    #[error(transparent)]
    Generate(#[from] KeyError),
}

/// The replicas' key, from the Secret `cfg` names, or a new one this replica creates it with
/// (another replica creating it at the same time: its key is read).
pub async fn shared(secrets: &Api<Secret>, cfg: &LeaderConfig) -> Result<Identity, SharedKeyError> {
    let name = secret_name(cfg);
    let api = |source| SharedKeyError::Api {
        name: name.clone(),
        source,
    };
    for _ in 0..3 {
        if let Some(secret) = secrets.get_opt(&name).await.map_err(api)? {
            let pkcs8 = secret
                .data
                .as_ref()
                .and_then(|d| d.get(SECRET_KEY))
                .ok_or_else(|| SharedKeyError::Garbled {
                    name: name.clone(),
                    why: "missing".into(),
                })?;
            return Identity::from_pkcs8(&pkcs8.0).map_err(|e| SharedKeyError::Garbled {
                name: name.clone(),
                why: e.to_string(),
            });
        }
        let identity = Identity::generate()?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            data: Some(
                [(
                    SECRET_KEY.to_string(),
                    ByteString(identity.pkcs8().to_vec()),
                )]
                .into(),
            ),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                info!(secret = %name, key = %identity.public(), "heartbeat key made for podha's replicas");
                return Ok(identity);
            }
            // Another replica made it first: read it.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(api(e)),
        }
    }
    Err(SharedKeyError::Garbled {
        name,
        why: "created and gone again".into(),
    })
}

/// How often a leader checks that its key is on the Lease (one read of one small object): a
/// Lease deleted and made again carries no key until it does.
pub const RECHECK: Duration = Duration::from_secs(2);
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http::Method;

    use super::*;
    use podha_fake_api::{FakeApi, Reply};

    /// A fake API server holding at most the one Secret, created by POST and read by GET.
    fn secrets(held: Arc<Mutex<Option<serde_json::Value>>>) -> Api<Secret> {
        let stored = held.clone();
        let api = FakeApi::new()
            .on(
                Method::POST,
                "/api/v1/namespaces/podha/secrets",
                move |req| {
                    *stored.lock().expect("lock") = Some(req.body.clone());
                    Reply::json(201, req.body.clone())
                },
            )
            .on(
                Method::GET,
                "/api/v1/namespaces/podha/secrets/*",
                move |_| match held.lock().expect("lock").clone() {
                    Some(secret) => Reply::json(200, secret),
                    None => Reply::status(404, "NotFound"),
                },
            );
        Api::namespaced(api.client(), "podha")
    }

    #[tokio::test]
    async fn the_replicas_share_one_key_the_first_one_makes() {
        let cfg = LeaderConfig::new("podha", "replica-a");
        assert_eq!(secret_name(&cfg), "podha-leader-heartbeat-key");
        let held = Arc::new(Mutex::new(None));
        let first = shared(&secrets(held.clone()), &cfg).await.expect("made");
        assert!(held.lock().expect("lock").is_some(), "kept in the Secret");
        let second = shared(
            &secrets(held.clone()),
            &LeaderConfig::new("podha", "replica-b"),
        )
        .await
        .expect("read");
        assert_eq!(
            second.public(),
            first.public(),
            "the second replica signs alike"
        );
        *held.lock().expect("lock") = Some(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "podha-leader-heartbeat-key"},
            "data": {"pkcs8": "bm90IGEga2V5"},
        }));
        let garbled = shared(&secrets(held), &cfg).await;
        assert!(
            matches!(garbled, Err(SharedKeyError::Garbled { .. })),
            "a garbled Secret is not overwritten: {garbled:?}"
        );
    }
}

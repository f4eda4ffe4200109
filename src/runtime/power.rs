//! The actuator's hand on a node's BMC (proof `BMC`): find the node's Secret in podha's
//! namespace, check it is bound to the node, and ask the BMC to force the machine off or say
//! whether it is off. One request per action: the decision loop sends an action again by its
//! backoff (`crate::backoff::action_retry`), so nothing here retries or waits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};

use crate::api::BMC_NODE_LABEL;
use crate::api::canonical_uuid;
use crate::redfish::{self, Bmc, Endpoint, PowerState, ResetType};

/// Why a power action failed.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    #[error("reading Secret {secret} in podha's namespace failed: {error}")]
    SecretUnread { secret: String, error: kube::Error },
    #[error("Secret {secret} is not in podha's namespace {namespace}")]
    SecretMissing { secret: String, namespace: String },
    #[error(
        "Secret {secret} is not bound to node {node}: it must carry the label {BMC_NODE_LABEL}={node} \
         (it has {found:?})"
    )]
    SecretUnbound {
        secret: String,
        node: String,
        found: Option<String>,
    },
    #[error("the BMC of node {node} (Secret {secret}): {error}")]
    Bmc {
        node: String,
        secret: String,
        error: redfish::Error,
    },
    #[error("the BMC of node {node} reports PowerState {state}, not Off yet")]
    NotOff { node: String, state: PowerState },
    #[error("the BMC of node {node} reports PowerState {state}, neither On nor Off: read again")]
    Unsettled { node: String, state: PowerState },
    #[error(
        "Secret {secret} leads to a system with UUID {found:?}, not node {node}'s \
         (status.nodeInfo.systemUUID {expected:?}): the address is another machine's, or the \
         BMC reports the UUID in another form (fencing.bmc.matchSystemUUID)"
    )]
    NotTheNode {
        node: String,
        secret: String,
        expected: String,
        found: Option<String>,
    },
    #[error(
        "node {node} reports systemUUID {uuid}, a placeholder many boards share: it cannot bind \
         the node to its BMC (set fencing.bmc.matchSystemUUID: false to rely on the Secret's \
         label alone)"
    )]
    PlaceholderUuid { node: String, uuid: String },
    #[error(
        "node {node} renewed its Lease since podha planned its power-off: it may be back, so \
         it was not powered off (the next round decides again)"
    )]
    LeaseRenewed { node: String },
    #[error("reading node {node}'s Lease before its power-off failed: {error}")]
    LeaseUnread { node: String, error: kube::Error },
    #[error(
        "podha sent ForceOff to the BMC of node {node} (Secret {secret}) and got no answer \
         ({error}): the machine may be off by podha's hand"
    )]
    ForceOffUnanswered {
        node: String,
        secret: String,
        error: redfish::Error,
    },
}

impl PowerError {
    /// A bounded label: the redfish error's own, or the Secret's trouble.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::SecretUnread { .. } => "secret_unread",
            Self::SecretMissing { .. } => "secret_missing",
            Self::SecretUnbound { .. } => "secret_unbound",
            Self::Bmc { error, .. } => error.as_str(),
            Self::NotOff { .. } => "not_off",
            Self::Unsettled { .. } => "unsettled",
            Self::NotTheNode { .. } => "not_the_node",
            Self::PlaceholderUuid { .. } => "placeholder_uuid",
            Self::LeaseRenewed { .. } => "lease_renewed",
            Self::LeaseUnread { .. } => "lease_unread",
            Self::ForceOffUnanswered { .. } => "force_off_unanswered",
        }
    }

    /// Whether the same action may succeed soon: a read not `Off` yet, a BMC or API server that
    /// may answer next time. A Secret missing, unbound or unreadable as settings, credentials
    /// refused, a system unknown: only a person can fix those (the action is still tried again,
    /// slowly, in case one did).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::NotOff { .. }
            | Self::Unsettled { .. }
            | Self::LeaseRenewed { .. }
            | Self::LeaseUnread { .. }
            | Self::ForceOffUnanswered { .. } => true,
            Self::SecretUnread { error, .. } => !matches!(
                error,
                kube::Error::Api(status) if (400..500).contains(&status.code) && status.code != 429
            ),
            Self::Bmc { error, .. } => error.is_transient(),
            Self::SecretMissing { .. }
            | Self::SecretUnbound { .. }
            | Self::NotTheNode { .. }
            | Self::PlaceholderUuid { .. } => false,
        }
    }
}

/// What a power action found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PowerOutcome {
    /// The BMC accepted the `ForceOff`.
    OffRequested,
    /// The BMC says the machine is off.
    Off,
    /// The BMC accepted the `On`, or says the machine is on or powering on (someone powered it
    /// on).
    OnRequested,
}

/// The BMCs podha talks to, one client per node, built from the node's Secret and kept while
/// the Secret stays the same (the client pins the system it found, so the reads that confirm
/// a `ForceOff` are of the system that took it).
#[derive(Clone)]
pub struct Power {
    secrets: Api<Secret>,
    /// The kubelets' Leases, read right before a `ForceOff`.
    node_leases: Api<Lease>,
    namespace: String,
    clients: Arc<Mutex<HashMap<String, BuiltClient>>>,
}

/// A node's BMC client and the version of the Secret (`uid/resourceVersion`) it was built from.
type BuiltClient = (String, Arc<Bmc>);

impl Power {
    /// Reads BMC Secrets in `namespace` (podha's own) only.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            node_leases: Api::namespaced(client.clone(), super::NODE_LEASE_NAMESPACE),
            secrets: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            clients: Arc::default(),
        }
    }

    /// Asks `node`'s BMC for `reset` (`ForceOff`, or `On`), unless the system is in that
    /// state already (a BMC may refuse a `ForceOff` of a machine that is off, as after another
    /// replica's; and someone may have powered it on); `leading` is asked right before the
    /// reset goes out (`None`, nothing sent, when it says no). The system must be the node's
    /// (see [`PowerError::NotTheNode`]), and before a `ForceOff` the node's Lease must not
    /// have been renewed since podha planned it ([`PowerError::LeaseRenewed`]). A `ForceOff`
    /// sent whose answer does not come is [`PowerError::ForceOffUnanswered`]: the BMC may have
    /// taken it.
    pub async fn reset(
        &self,
        target: &Target<'_>,
        reset: ResetType,
        leading: impl Fn() -> bool,
    ) -> Result<Option<PowerOutcome>, PowerError> {
        let bmc = self.bmc(target).await?;
        let state = self.identified_read(target, &bmc).await?;
        let asked = match (reset, &state) {
            (ResetType::ForceOff, PowerState::Off) => return Ok(Some(PowerOutcome::Off)),
            (ResetType::ForceOff, _) => PowerOutcome::OffRequested,
            (ResetType::On, PowerState::On | PowerState::PoweringOn) => {
                return Ok(Some(PowerOutcome::OnRequested));
            }
            (ResetType::On, PowerState::Off) => PowerOutcome::OnRequested,
            // A BMC between states (or rebooting, its state unknown): read again.
            (ResetType::On, _) => {
                return Err(PowerError::Unsettled {
                    node: target.node.to_string(),
                    state,
                });
            }
        };
        if reset == ResetType::ForceOff {
            self.lease_unchanged(target).await?;
        }
        let went_out = AtomicBool::new(false);
        let proceed = || {
            let go = leading();
            went_out.store(go, Ordering::Relaxed);
            go
        };
        match bmc.reset_if(reset, proceed).await {
            Ok(sent) => Ok(sent.then_some(asked)),
            Err(error)
                if reset == ResetType::ForceOff
                    && went_out.load(Ordering::Relaxed)
                    && !refused(&error) =>
            {
                Err(PowerError::ForceOffUnanswered {
                    node: target.node.to_string(),
                    secret: target.secret.to_string(),
                    error,
                })
            }
            Err(error) => Err(bmc_error(target, error)),
        }
    }

    /// Whether `target`'s Lease still says what podha saw when it planned the power-off (no
    /// Lease at all is nothing renewed); read right before the `ForceOff`, so that a machine
    /// whose kubelet renewed while the action waited or read its BMC is not powered off.
    async fn lease_unchanged(&self, target: &Target<'_>) -> Result<(), PowerError> {
        let node = target.node.to_string();
        let renewed =
            super::node_lease::renewed_since(&self.node_leases, target.node, target.lease_seen)
                .await
                .map_err(|error| PowerError::LeaseUnread {
                    node: node.clone(),
                    error,
                })?;
        if renewed {
            return Err(PowerError::LeaseRenewed { node });
        }
        Ok(())
    }

    /// Reads `node`'s power state: `Off`, or [`PowerError::NotOff`].
    pub async fn read(&self, target: &Target<'_>) -> Result<PowerOutcome, PowerError> {
        let bmc = self.bmc(target).await?;
        match self.identified_read(target, &bmc).await? {
            state if state.is_off() => Ok(PowerOutcome::Off),
            state => Err(PowerError::NotOff {
                node: target.node.to_string(),
                state,
            }),
        }
    }

    /// The node's BMC as podha would find it at the death, asked now: its Secret found and
    /// bound to the node, the BMC answering with its credentials, the system the node's.
    /// Its power state; nothing is powered.
    pub async fn check(&self, target: &Target<'_>) -> Result<PowerState, PowerError> {
        let bmc = self.bmc(target).await?;
        self.identified_read(target, &bmc).await
    }

    /// The system's power state, once it is shown to be the node's machine.
    async fn identified_read(
        &self,
        target: &Target<'_>,
        bmc: &Bmc,
    ) -> Result<PowerState, PowerError> {
        let reading = bmc.read().await.map_err(|error| bmc_error(target, error))?;
        if let Some(expected) = target.system_uuid {
            let found = reading.uuid.as_deref().map(canonical_uuid);
            let known = canonical_uuid(expected);
            if PLACEHOLDER_UUIDS.contains(&known.as_str()) {
                return Err(PowerError::PlaceholderUuid {
                    node: target.node.to_string(),
                    uuid: expected.to_string(),
                });
            }
            if known.len() != 32 || found.as_deref() != Some(known.as_str()) {
                return Err(PowerError::NotTheNode {
                    node: target.node.to_string(),
                    secret: target.secret.to_string(),
                    expected: expected.to_string(),
                    found: reading.uuid,
                });
            }
        }
        Ok(reading.power)
    }

    /// The client of `node`'s BMC, from its Secret as it is now.
    async fn bmc(&self, target: &Target<'_>) -> Result<Arc<Bmc>, PowerError> {
        let (node, secret) = (target.node, target.secret);
        let object = match self.secrets.get_opt(secret).await {
            Ok(Some(object)) => object,
            Ok(None) => {
                return Err(PowerError::SecretMissing {
                    secret: secret.to_string(),
                    namespace: self.namespace.clone(),
                });
            }
            Err(error) => {
                return Err(PowerError::SecretUnread {
                    secret: secret.to_string(),
                    error,
                });
            }
        };
        let bound = object.labels().get(BMC_NODE_LABEL);
        if bound.map(String::as_str) != Some(node) {
            return Err(PowerError::SecretUnbound {
                secret: secret.to_string(),
                node: node.to_string(),
                found: bound.cloned(),
            });
        }
        // The same Secret object in the same version: the client built from it still holds.
        let version = format!(
            "{}/{}",
            object.uid().unwrap_or_default(),
            object.resource_version().unwrap_or_default()
        );
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((built_from, bmc)) = clients.get(node)
            && *built_from == version
        {
            return Ok(bmc.clone());
        }
        let data: std::collections::BTreeMap<String, Vec<u8>> = object
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        let bmc = Endpoint::from_secret_data(&data)
            .and_then(Bmc::new)
            .map(Arc::new)
            .map_err(|error| bmc_error(target, error))?;
        clients.insert(node.to_string(), (version, bmc.clone()));
        Ok(bmc)
    }
}

/// Whether a failure of a request that went out is the BMC's answer that it did not take it
/// (an error status, or a handshake that never let the request through); any other leaves
/// unknown what it did (no answer in time, the connection cut, an answer cut short).
fn refused(error: &redfish::Error) -> bool {
    matches!(
        error,
        redfish::Error::Unauthorized { .. }
            | redfish::Error::UnknownSystem { .. }
            | redfish::Error::ResetNotAllowed { .. }
            | redfish::Error::Refused { .. }
            | redfish::Error::Tls { .. }
    )
}

fn bmc_error(target: &Target<'_>, error: redfish::Error) -> PowerError {
    PowerError::Bmc {
        node: target.node.to_string(),
        secret: target.secret.to_string(),
        error,
    }
}

/// System UUIDs that firmware puts on many boards alike (the last two the same SMBIOS
/// default, read with and without its first fields' bytes swapped): matching one binds
/// nothing. Any other UUID two nodes report is refused too (`planner::proof::
/// system_uuid_shared_with`).
const PLACEHOLDER_UUIDS: [&str; 4] = [
    "00000000000000000000000000000000",
    "ffffffffffffffffffffffffffffffff",
    "03000200040005000006000700080009",
    "00020003000400050006000700080009",
];

/// A node's BMC, as a power intent names it.
pub struct Target<'a> {
    pub node: &'a str,
    /// The Secret in podha's namespace.
    pub secret: &'a str,
    /// The UUID its system must report, when the policy matches it.
    pub system_uuid: Option<&'a str>,
    /// For a `ForceOff`: the node's Lease `renewTime` as podha saw it when it planned the
    /// action (see [`Power::reset`]).
    pub lease_seen: Option<k8s_openapi::jiff::Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use podha_fake_api::Reply;

    #[test]
    fn uuids_compare_by_their_hex_digits_and_placeholders_are_known() {
        assert_eq!(
            canonical_uuid("4C4C4544-0035-5910-8052-B4C04F4B4E32"),
            canonical_uuid("4c4c45440035591080 52b4c04f4b4e32")
        );
        assert_ne!(
            canonical_uuid("4c4c4544-0035-5910-8052-b4c04f4b4e32"),
            canonical_uuid("4c4c4544-0035-5910-8052-b4c04f4b4e33")
        );
        assert_eq!(canonical_uuid(""), "");
        assert!(
            PLACEHOLDER_UUIDS
                .contains(&canonical_uuid("03000200-0400-0500-0006-000700080009").as_str())
        );
    }

    /// A fake API server that answers the read of node `n1`'s Lease with its `renew_time`
    /// (`None`: 404), and any other request with 404.
    fn lease_server(renew_time: Option<&'static str>) -> Power {
        let api = podha_fake_api::FakeApi::new().on(
            http::Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
            move |_| match renew_time {
                Some(t) => Reply::json(
                    200,
                    serde_json::json!({
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": "n1", "namespace": "kube-node-lease"},
                        "spec": {"holderIdentity": "n1", "renewTime": t},
                    }),
                ),
                None => Reply::status(404, "NotFound"),
            },
        );
        Power::new(api.client(), "podha-system")
    }

    #[tokio::test]
    async fn a_lease_renewed_since_the_plan_stops_the_power_off() {
        let seen: k8s_openapi::jiff::Timestamp =
            "2026-11-27T05:00:00.000000Z".parse().expect("time");
        let target = |lease_seen| Target {
            node: "n1",
            secret: "bmc-n1",
            system_uuid: None,
            lease_seen,
        };
        let same = lease_server(Some("2026-11-27T05:00:00.000000Z"));
        assert!(same.lease_unchanged(&target(Some(seen))).await.is_ok());
        let renewed = lease_server(Some("2026-11-27T05:00:10.000000Z"));
        assert!(matches!(
            renewed.lease_unchanged(&target(Some(seen))).await,
            Err(PowerError::LeaseRenewed { .. })
        ));
        // podha never saw a renewTime, the Lease has one: it cannot tell, so no power-off.
        assert!(matches!(
            same.lease_unchanged(&target(None)).await,
            Err(PowerError::LeaseRenewed { .. })
        ));
        // No Lease at all: nothing renewed.
        assert!(
            lease_server(None)
                .lease_unchanged(&target(Some(seen)))
                .await
                .is_ok()
        );
    }

    #[test]
    fn only_a_state_still_changing_or_a_bmc_that_may_answer_is_retried_soon() {
        let node = || "n1".to_string();
        let secret = || "bmc-n1".to_string();
        assert!(
            PowerError::NotOff {
                node: node(),
                state: PowerState::On
            }
            .is_transient()
        );
        assert!(
            PowerError::Unsettled {
                node: node(),
                state: PowerState::Other("null".into())
            }
            .is_transient()
        );
        for lasting in [
            PowerError::SecretMissing {
                secret: secret(),
                namespace: "podha-system".into(),
            },
            PowerError::SecretUnbound {
                secret: secret(),
                node: node(),
                found: Some("n2".into()),
            },
            PowerError::NotTheNode {
                node: node(),
                secret: secret(),
                expected: "a".into(),
                found: Some("b".into()),
            },
            PowerError::PlaceholderUuid {
                node: node(),
                uuid: "00000000-0000-0000-0000-000000000000".into(),
            },
        ] {
            assert!(!lasting.is_transient(), "{lasting}");
        }
    }
}

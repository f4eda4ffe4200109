//! A node's Lease read right before podha asks something of its machine (a fence request, a
//! BMC's `ForceOff`): the decision was made on podha's view, which a watch that lags or stalls
//! may keep from a renewal the kubelet made since. A quorum read sees it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

/// Whether `node`'s Lease says another `renewTime` than `seen`, what podha's view held when it
/// planned the action: the kubelet renewed since. No Lease, or one without a renewal, renewed
/// nothing.
pub async fn renewed_since(
    leases: &Api<Lease>,
    node: &str,
    seen: Option<Timestamp>,
) -> Result<bool, kube::Error> {
    let now = leases
        .get_opt(node)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.renew_time)
        .map(|t| t.0);
    Ok(now.is_some() && now != seen)
}

//! Between CSI's wire types and the store: access modes in, gRPC status codes out.

use tonic::Status;

use crate::proto::VolumeCapability;
use crate::proto::volume_capability::AccessType;
use crate::proto::volume_capability::access_mode::Mode;
use crate::store::{self, AccessMode};

/// The one access mode a request's capabilities ask for. podha-csi serves directories, so every
/// capability must be a mount (not a block device) and all must name the same supported mode.
pub fn access_mode(capabilities: &[VolumeCapability]) -> Result<AccessMode, Status> {
    let mut chosen = None;
    for capability in capabilities {
        if let Some(AccessType::Block(_)) = capability.access_type {
            return Err(Status::invalid_argument(
                "block access is not supported: podha-csi volumes are directories",
            ));
        }
        let mode = capability
            .access_mode
            .as_ref()
            .map(|m| m.mode())
            .unwrap_or(Mode::Unknown);
        let mode = supported(mode).ok_or_else(|| {
            Status::invalid_argument(format!("access mode {mode:?} is not supported"))
        })?;
        if chosen.is_some_and(|c| c != mode) {
            return Err(Status::invalid_argument(
                "capabilities name more than one access mode",
            ));
        }
        chosen = Some(mode);
    }
    chosen.ok_or_else(|| Status::invalid_argument("volume capabilities missing"))
}

/// The sidecars send ReadWriteOnce as SINGLE_NODE_MULTI_WRITER (and ReadWriteOncePod as
/// SINGLE_NODE_SINGLE_WRITER) to a plugin that reports the SINGLE_NODE_MULTI_WRITER
/// capability, as podha-csi does; older callers send SINGLE_NODE_WRITER for both.
fn supported(mode: Mode) -> Option<AccessMode> {
    match mode {
        Mode::SingleNodeWriter | Mode::SingleNodeMultiWriter => Some(AccessMode::SingleNodeWriter),
        Mode::SingleNodeSingleWriter => Some(AccessMode::SingleNodeSingleWriter),
        Mode::MultiNodeMultiWriter => Some(AccessMode::MultiNodeMultiWriter),
        _ => None,
    }
}

/// The code the CSI spec prescribes for each store error.
pub fn status(error: store::Error) -> Status {
    use store::Error::*;
    let message = error.to_string();
    match error {
        NotFound(_) => Status::not_found(message),
        Mismatch { .. } => Status::already_exists(message),
        PublishedElsewhere { .. } | InUseByPod { .. } | StillPublished { .. } => {
            Status::failed_precondition(message)
        }
        Fenced { .. } => Status::permission_denied(message),
        InvalidId(_) => Status::invalid_argument(message),
        Io { .. } | Json { .. } => Status::internal(message),
    }
}

/// A required string field of a request.
pub fn required<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} missing")))
    } else {
        Ok(value)
    }
}

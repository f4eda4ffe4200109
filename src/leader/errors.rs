//! Why the election stops, and which failures of the lease crate and of the watch of the Lease
//! a retry can fix.

use std::time::Duration;

use kube::runtime::watcher;
use kube_lease_manager::LeaseManagerError;

/// Why leader election stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader election config: {0}")]
    InvalidConfig(String),
    /// An error no retry can fix (credentials, RBAC, invalid request, broken lease state).
    #[error("leader election cannot go on: {0}")]
    Fatal(#[source] LeaseManagerError),
    /// The API server refuses to let us watch the lease (credentials, RBAC).
    #[error("watch of the leader lease refused: {0}")]
    WatchRefused(#[source] watcher::Error),
    #[error("watch of the leader lease ended")]
    WatchEnded,
    #[error("releasing the leader lease failed: {0}")]
    Release(#[source] LeaseManagerError),
    #[error("releasing the leader lease took longer than {0:?}")]
    ReleaseTimeout(Duration),
}

impl LeaderError {
    /// Bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LeaderError::InvalidConfig(_) => "invalid_config",
            LeaderError::Fatal(_) => "fatal",
            LeaderError::WatchRefused(_) => "watch_refused",
            LeaderError::WatchEnded => "watch_ended",
            LeaderError::Release(_) => "release",
            LeaderError::ReleaseTimeout(_) => "release_timeout",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum OnError {
    Retry,
    /// The lease is gone: a fresh manager recreates it.
    Rebuild,
    Fatal,
}

pub(super) fn on_error(error: &LeaseManagerError) -> OnError {
    match error {
        LeaseManagerError::NonexistentLease(_) => OnError::Rebuild,
        LeaseManagerError::KubeError(kube::Error::Api(status)) => match status.code {
            404 => OnError::Rebuild,
            400 | 401 | 403 | 422 => OnError::Fatal,
            _ => OnError::Retry,
        },
        LeaseManagerError::KubeError(_) => OnError::Retry,
        LeaseManagerError::InconsistentState(_)
        | LeaseManagerError::LeaseAlreadyExists(_)
        | LeaseManagerError::ControlChannelError(_) => OnError::Fatal,
    }
}

pub(super) fn watch_refused(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    matches!(status.code, 401 | 403)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn errors_are_retried_unless_no_retry_can_help() {
        let api = |code| {
            LeaseManagerError::KubeError(kube::Error::Api(
                Status::failure("x", "y").with_code(code).boxed(),
            ))
        };
        assert_eq!(on_error(&api(500)), OnError::Retry);
        assert_eq!(on_error(&api(429)), OnError::Retry);
        assert_eq!(on_error(&api(409)), OnError::Retry);
        assert_eq!(on_error(&api(404)), OnError::Rebuild);
        assert_eq!(on_error(&api(403)), OnError::Fatal);
        assert_eq!(on_error(&api(401)), OnError::Fatal);
        assert_eq!(
            on_error(&LeaseManagerError::NonexistentLease("l".into())),
            OnError::Rebuild
        );
        assert_eq!(
            on_error(&LeaseManagerError::InconsistentState("x".into())),
            OnError::Fatal
        );
    }

    #[test]
    fn only_auth_failures_end_the_lease_watch() {
        let api = |code| kube::Error::Api(Status::failure("x", "y").with_code(code).boxed());
        assert!(watch_refused(&watcher::Error::InitialListFailed(api(403))));
        assert!(watch_refused(&watcher::Error::WatchStartFailed(api(401))));
        let gone = Status::failure("x", "Expired").with_code(410).boxed();
        assert!(!watch_refused(&watcher::Error::WatchError(gone)));
        assert!(!watch_refused(&watcher::Error::WatchFailed(api(500))));
        assert!(!watch_refused(&watcher::Error::NoResourceVersion));
    }
}

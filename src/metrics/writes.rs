//! What the writer's requests to the API server cost and how often they failed: actions,
//! events and status patches alike.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::{ACTION_BUCKETS, ActionKind, register};

/// A write the writer performs: the `operation` of `podha_api_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiOperation {
    Action(ActionKind),
    CreateEvent,
    PatchStatus,
}

impl ApiOperation {
    /// Every operation: each [`ActionKind`], then the reports.
    pub fn all() -> impl Iterator<Item = ApiOperation> {
        ActionKind::ALL
            .into_iter()
            .map(ApiOperation::Action)
            .chain([ApiOperation::CreateEvent, ApiOperation::PatchStatus])
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            ApiOperation::Action(kind) => kind.as_str(),
            ApiOperation::CreateEvent => "create_event",
            ApiOperation::PatchStatus => "patch_status",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Writes {
    api_errors: IntCounterVec,
    action_requests: HistogramVec,
}

impl Writes {
    /// Registers the families in `registry`, with the error counter of every
    /// [`ApiOperation`] at 0, so that an alert on it has a series to evaluate.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let api_errors = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "podha_api_errors_total",
                    "Failed writes to the Kubernetes API, by operation; they are retried with \
                     backoff.",
                ),
                &["operation"],
            )?,
        )?;
        let action_requests = register(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "podha_action_request_duration_seconds",
                    "Time an action spent in its API requests (first request to last \
                     response), by kind of action.",
                )
                .buckets(ACTION_BUCKETS.to_vec()),
                &["kind"],
            )?,
        )?;
        for operation in ApiOperation::all() {
            api_errors.with_label_values(&[operation.as_str()]);
        }
        Ok(Self {
            api_errors,
            action_requests,
        })
    }

    pub fn inc_api_errors(&self, operation: ApiOperation) {
        self.api_errors
            .with_label_values(&[operation.as_str()])
            .inc();
    }

    pub fn observe_action_requests(&self, kind: ActionKind, duration: Duration) {
        self.action_requests
            .with_label_values(&[kind.as_str()])
            .observe(duration.as_secs_f64());
    }
}

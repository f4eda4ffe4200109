//! Publishing Kubernetes Events (events.k8s.io/v1), one per distinct note.
//!
//! An event repeated within [`SERIES_WINDOW`] (same object, type, reason, action and note)
//! becomes a series on the first one, the way client-go's events/v1 recorder folds them. The
//! note is part of that sameness: kube's `Recorder` leaves it out and keeps only the first note of
//! a series, so when a dry run held a node's fence request and then its pod's deletion, both
//! `DryRun` events on the policy, the second note (the one naming the pod) was lost. The decision
//! loop already reports each hold, skip and action once, so every note it sends is worth keeping.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client};
use serde_json::json;

use super::writer::EventNote;

/// How long after its last occurrence a repeated event is still counted on the first one
/// (client-go and kube use 6 minutes too); later, it is a new event.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// What makes two events the same one: everything but the time. The regarding object is named
/// by kind, namespace, name and uid (not its resourceVersion, which changes between events).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    warning: bool,
    reason: &'static str,
    action: &'static str,
    regarding: [Option<String>; 5],
    note: String,
}

impl EventKey {
    fn of(note: &EventNote) -> Self {
        let r = &note.regarding;
        Self {
            warning: note.warning,
            reason: note.reason,
            action: note.action,
            regarding: [
                r.api_version.clone(),
                r.kind.clone(),
                r.namespace.clone(),
                r.name.clone(),
                r.uid.clone(),
            ],
            note: note.note.clone(),
        }
    }
}

/// An event published within the series window.
#[derive(Clone, Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

pub struct EventPublisher {
    client: Client,
    reporter: Reporter,
    recent: Mutex<HashMap<EventKey, Published>>,
}

impl EventPublisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Creates the event, or counts it on the same event published within the series window.
    pub async fn publish(&self, note: &EventNote) -> Result<(), kube::Error> {
        self.publish_at(note, Timestamp::now()).await
    }

    async fn publish_at(&self, note: &EventNote, now: Timestamp) -> Result<(), kube::Error> {
        let key = EventKey::of(note);
        let namespace = note.regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        if let Some(earlier) = self.earlier(&key, now) {
            let count = earlier.count + 1;
            let series = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
            match api
                .patch(
                    &earlier.name,
                    &PatchParams::default(),
                    &Patch::Merge(&series),
                )
                .await
            {
                Ok(_) => {
                    self.remember(key, earlier.name, count, now);
                    return Ok(());
                }
                // Gone (the API server's event TTL, or somebody deleted it): a new one.
                Err(kube::Error::Api(status)) if status.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let created = api
            .create(&PostParams::default(), &self.event(note, now))
            .await?;
        if let Some(name) = created.metadata.name {
            self.remember(key, name, 1, now);
        }
        Ok(())
    }

    /// The same event published within the window before `now`, if any; forgets the older ones.
    fn earlier(&self, key: &EventKey, now: Timestamp) -> Option<Published> {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.retain(|_, p| within_window(p.last, now));
        recent.get(key).cloned()
    }

    fn remember(&self, key: EventKey, name: String, count: i32, last: Timestamp) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.insert(key, Published { name, count, last });
    }

    fn event(&self, note: &EventNote, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        let about = note.regarding.name.as_deref().unwrap_or(controller);
        K8sEvent {
            metadata: ObjectMeta {
                // `<object>.<controller>-<random>`: the API server makes the name unique (a
                // generated name must not end in a dot).
                generate_name: Some(format!("{about}.{controller}-")),
                namespace: note.regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.into()),
            reason: Some(note.reason.into()),
            action: Some(note.action.into()),
            note: Some(note.note.clone()),
            regarding: Some(note.regarding.clone()),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            ..K8sEvent::default()
        }
    }
}

fn within_window(last: Timestamp, now: Timestamp) -> bool {
    now.duration_since(last).unsigned_abs() < SERIES_WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use k8s_openapi::api::core::v1::ObjectReference;
    use podha_fake_api::{FakeApi, Reply};
    use std::sync::Arc;

    fn dry_run(note: &str) -> EventNote {
        EventNote {
            regarding: ObjectReference {
                api_version: Some("podha.io/v1alpha1".into()),
                kind: Some("PodHAPolicy".into()),
                name: Some("db".into()),
                uid: Some("u-1".into()),
                resource_version: Some("7".into()),
                ..ObjectReference::default()
            },
            warning: true,
            reason: "DryRun",
            action: "Hold",
            note: note.into(),
        }
    }

    /// A publisher on a fake API server that answers a create with the event named
    /// `<generateName><n>` (the `n`th create) and a patch with the event it names.
    fn publisher_on_fake_api() -> (EventPublisher, FakeApi) {
        let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let api = FakeApi::new()
            .on(Method::POST, EVENTS, move |req| {
                let mut event = req.body.clone();
                let prefix = event["metadata"]["generateName"].as_str().unwrap_or("");
                assert!(
                    valid_generate_name(prefix),
                    "invalid generateName {prefix:?}"
                );
                let n = created.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                event["metadata"]["name"] = json!(format!("{prefix}{n}"));
                Reply::json(200, event)
            })
            .on(Method::PATCH, &format!("{EVENTS}/*"), |req| {
                let name = req.path.rsplit('/').next().unwrap_or("");
                Reply::json(
                    200,
                    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                           "metadata": {"name": name}}),
                )
            });
        let reporter = Reporter {
            controller: "podha".into(),
            instance: Some("podha-a".into()),
        };
        (EventPublisher::new(api.client(), reporter), api)
    }

    /// Where the events of namespace `default` are created.
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

    /// The API server's rule for a generated name's prefix: a DNS subdomain (dot-separated
    /// labels of lowercase alphanumerics and dashes, each starting and ending alphanumeric),
    /// except that it may end in a dash.
    fn valid_generate_name(prefix: &str) -> bool {
        let masked = match prefix.strip_suffix('-') {
            Some(rest) => format!("{rest}a"),
            None => prefix.to_string(),
        };
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        !masked.is_empty()
            && masked.split('.').all(|label| {
                label.starts_with(alnum)
                    && label.ends_with(alnum)
                    && label.chars().all(|c| alnum(c) || c == '-')
            })
    }

    #[test]
    fn the_generated_name_rule_is_the_api_servers() {
        assert!(valid_generate_name("node-1.podha-"));
        assert!(
            !valid_generate_name("node-1."),
            "the API server refused this"
        );
        assert!(!valid_generate_name("Node-1.podha-"));
    }

    #[tokio::test]
    async fn events_that_differ_only_in_their_note_are_two_events() {
        let (publisher, api) = publisher_on_fake_api();
        let now = Timestamp::now();
        for note in [
            "would ask for a fence of node-12",
            "would force-delete pod ns/db-0",
        ] {
            publisher
                .publish_at(&dry_run(note), now)
                .await
                .expect("published");
        }
        let seen = api.requests();
        assert_eq!(seen.len(), 2, "{seen:?}");
        for (request, note) in seen.iter().zip(["node-12", "ns/db-0"]) {
            assert_eq!(request.line(), format!("POST {EVENTS}"));
            let body = request.body.to_string();
            assert!(body.contains(note), "{body}");
            assert_eq!(request.body["reportingInstance"], "podha-a", "{body}");
        }
    }

    #[tokio::test]
    async fn a_repeated_event_is_counted_on_the_first_until_the_window_passes() {
        let (publisher, api) = publisher_on_fake_api();
        let start = Timestamp::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut same = dry_run("would force-delete pod ns/db-0");
        publisher.publish_at(&same, at(0)).await.expect("created");
        // The policy changed in between: still the same object, still the same event.
        same.regarding.resource_version = Some("8".into());
        publisher.publish_at(&same, at(60)).await.expect("counted");
        publisher.publish_at(&same, at(400)).await.expect("counted");
        // Last seen at 400 s: 6 minutes later it is a new event.
        publisher
            .publish_at(&same, at(400 + 360))
            .await
            .expect("created");
        let seen = api.requests();
        let requests: Vec<(&str, &str)> = seen
            .iter()
            .map(|r| (r.method.as_str(), r.path.rsplit('/').next().unwrap_or("")))
            .collect();
        assert_eq!(
            requests,
            [
                ("POST", "events"),
                ("PATCH", "db.podha-1"),
                ("PATCH", "db.podha-1"),
                ("POST", "events")
            ]
        );
        assert_eq!(seen[1].body["series"]["count"], 2, "{}", seen[1].body);
        assert_eq!(seen[2].body["series"]["count"], 3, "{}", seen[2].body);
    }
}

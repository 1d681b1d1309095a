//! Publishing Events (`events.k8s.io/v1`) with a bounded memory of recent ones.
//!
//! An event that repeats within [`SERIES_WINDOW`] updates the first one's `series` (count and last
//! observed time) instead of creating another, as client-go's recorder does. kube-runtime's
//! `Recorder` remembers every event it published for six minutes and scans all of them on each
//! publish: at 10 000 machines that was tens of MiB and O(M²) work. This one remembers at most
//! [`SERIES_CAPACITY`] events (client-go's LRU holds 4 096) and drops expired ones in one pass at a
//! time, not on every publish.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// How long a repeat counts as the same series.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// How many recent events are remembered.
pub const SERIES_CAPACITY: usize = 4096;

/// An event to publish about one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventSpec {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// Why, in UpperCamelCase.
    pub reason: String,
    /// What was done or failed, in UpperCamelCase.
    pub action: String,
    /// For humans.
    pub note: String,
}

/// Who reports the events.
#[derive(Clone, Debug)]
pub struct Reporter {
    /// `reportingController`.
    pub controller: String,
    /// `reportingInstance` (the pod name), else the controller's name.
    pub instance: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    regarding: (String, String, String, String),
    event: EventSpec,
}

/// A recently published event.
#[derive(Clone, Debug)]
struct Recent {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

/// What publishing one event takes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Publish {
    /// A new Event.
    Create,
    /// The Event `namespace/name` happened again: its series now counts `count`.
    Repeat {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// The recent events, bounded by [`SERIES_CAPACITY`].
#[derive(Default)]
struct Recents {
    by_key: HashMap<SeriesKey, Recent>,
}

impl Recents {
    fn observe(&mut self, key: &SeriesKey, now: Instant) -> Publish {
        match self.by_key.get_mut(key) {
            Some(r) if now.saturating_duration_since(r.last) < SERIES_WINDOW => {
                r.count = r.count.saturating_add(1);
                r.last = now;
                Publish::Repeat {
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    count: r.count,
                }
            }
            _ => Publish::Create,
        }
    }

    fn remember(&mut self, key: SeriesKey, namespace: String, name: String, now: Instant) {
        if self.by_key.len() >= SERIES_CAPACITY && !self.by_key.contains_key(&key) {
            self.by_key
                .retain(|_, r| now.saturating_duration_since(r.last) < SERIES_WINDOW);
            if self.by_key.len() >= SERIES_CAPACITY {
                // Still full of live series: forget the older half in one pass, so the next
                // SERIES_CAPACITY / 2 publishes do not scan again.
                let mut ages: Vec<Instant> = self.by_key.values().map(|r| r.last).collect();
                let middle = ages.len() / 2;
                let (_, cut, _) = ages.select_nth_unstable(middle);
                let cut = *cut;
                self.by_key.retain(|_, r| r.last > cut);
            }
        }
        self.by_key.insert(
            key,
            Recent {
                namespace,
                name,
                count: 1,
                last: now,
            },
        );
    }
}

/// Publishes Events as [`Reporter`].
pub struct EventRecorder {
    client: kube::Client,
    reporter: Reporter,
    recents: Mutex<Recents>,
}

impl EventRecorder {
    /// A recorder writing through `client`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recents: Mutex::default(),
        }
    }

    /// Publishes `event` about the object `regarding`: a new Event, or the series of the same event
    /// published less than [`SERIES_WINDOW`] ago.
    pub async fn publish(
        &self,
        event: &EventSpec,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let key = SeriesKey {
            regarding: (
                regarding.kind.clone().unwrap_or_default(),
                namespace.clone(),
                regarding.name.clone().unwrap_or_default(),
                regarding.uid.clone().unwrap_or_default(),
            ),
            event: event.clone(),
        };
        let decision = match self.recents.lock() {
            Ok(mut recents) => recents.observe(&key, Instant::now()),
            Err(_) => Publish::Create,
        };
        let now = Timestamp::now();
        if let Publish::Repeat {
            namespace,
            name,
            count,
        } = decision
        {
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(now),
            };
            let patched = Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "series": series })),
                )
                .await;
            match patched {
                // Events expire (an hour by default): a repeat of an expired one is a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                other => return other.map(|_| ()),
            }
        }
        let name = format!(
            "{}.{:x}",
            regarding
                .name
                .as_deref()
                .unwrap_or(&self.reporter.controller),
            now.as_nanosecond()
        );
        let new = K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: Some(event.note.clone()),
            type_: Some(event.type_.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &new)
            .await?;
        if let Ok(mut recents) = self.recents.lock() {
            recents.remember(key, namespace, name, Instant::now());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(object: &str, reason: &str) -> SeriesKey {
        SeriesKey {
            regarding: (
                "MicrovmMachine".into(),
                "ns".into(),
                object.into(),
                format!("uid-{object}"),
            ),
            event: EventSpec {
                type_: "Normal",
                reason: reason.into(),
                action: "Create".into(),
                note: "created".into(),
            },
        }
    }

    #[test]
    fn a_repeat_within_the_window_counts_in_the_series() {
        let t0 = Instant::now();
        let mut recents = Recents::default();
        let k = key("m1", "MicrovmCreated");
        assert_eq!(recents.observe(&k, t0), Publish::Create);
        recents.remember(k.clone(), "ns".into(), "m1.1".into(), t0);
        let again = recents.observe(&k, t0 + Duration::from_secs(10));
        assert_eq!(
            again,
            Publish::Repeat {
                namespace: "ns".into(),
                name: "m1.1".into(),
                count: 2
            }
        );
        assert_eq!(
            recents.observe(&key("m2", "MicrovmCreated"), t0),
            Publish::Create,
            "another object is another series"
        );
        assert_eq!(
            recents.observe(&k, t0 + Duration::from_secs(10) + SERIES_WINDOW),
            Publish::Create,
            "a repeat after the window starts a new Event"
        );
    }

    #[test]
    fn memory_stays_bounded_and_keeps_the_newest() {
        let t0 = Instant::now();
        let mut recents = Recents::default();
        for i in 0..3 * SERIES_CAPACITY {
            let at = t0 + Duration::from_millis(i as u64);
            recents.remember(
                key(&format!("m{i}"), "MicrovmCreated"),
                "ns".into(),
                format!("e{i}"),
                at,
            );
            assert!(recents.by_key.len() <= SERIES_CAPACITY);
        }
        let last = 3 * SERIES_CAPACITY - 1;
        let newest = key(&format!("m{last}"), "MicrovmCreated");
        assert!(matches!(
            recents.observe(&newest, t0 + Duration::from_secs(60)),
            Publish::Repeat { .. }
        ));
        assert_eq!(
            recents.observe(&key("m0", "MicrovmCreated"), t0 + Duration::from_secs(60)),
            Publish::Create,
            "the oldest were forgotten"
        );
    }
}

//! The safety net `--sync-period` promises: every cached object reconciled at least once per
//! period, however quiet it is.
//!
//! One timer for all objects, a slice of them per tick, instead of a timer per object: a settled
//! object's timer held about 0.9 KiB in the controller's scheduler (8.8 MiB at 10 000
//! MicrovmMachines, by a heap profile), and the slices spread the period's reconciles evenly
//! rather than in a burst.
//!
//! An object in its first steps ([`FIRST_STEPS`], or the period if shorter) is left to its
//! changes: a resync while it waits for bootstrap data or its microVM starts would write the
//! transient status those steps otherwise pass through unwritten (at 30 000 machines, 0.35 more
//! status writes per machine when every object was resynced from its creation on). Past them it is
//! resynced like any other, so a wait no watch ends (a bootstrap Secret fixed in place, without a
//! `value` key before) is looked at again within a period of those minutes.

use std::time::Duration;

use capmvm_reconcile::microvm::{FNV1A64_OFFSET, fnv1a64_extend};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc::UnboundedSender;

/// The most slices a period is cut into (one tick every 10 s at the default 10 minutes).
const MAX_SLICES: u64 = 60;

/// How long a new object is left to its changes before resyncs include it.
const FIRST_STEPS: Duration = Duration::from_secs(120);

/// How many slices `period` is cut into: at most [`MAX_SLICES`], and ticks at least a second apart.
fn slices(period: Duration) -> u64 {
    period.as_secs().clamp(1, MAX_SLICES)
}

/// The slice an object falls in: fixed for its name (FNV-1a, stable across processes, unlike the
/// std hasher's random keys), so each object comes round once per period.
fn slice_of(namespace: Option<&str>, name: &str, slices: u64) -> u64 {
    let ns = fnv1a64_extend(FNV1A64_OFFSET, namespace.unwrap_or_default().as_bytes());
    fnv1a64_extend(fnv1a64_extend(ns, b"/"), name.as_bytes()) % slices
}

/// Sends every object of `store` past its first steps to `to` once per `period`, one slice per
/// tick, until `to` closes.
pub async fn resync<K>(store: Store<K>, period: Duration, to: UnboundedSender<ObjectRef<K>>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let slices = slices(period);
    let tick = period / u32::try_from(slices).unwrap_or(1);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for slice in (0..slices).cycle() {
        ticks.tick().await;
        let grown_up = SignedDuration::try_from(period.min(FIRST_STEPS))
            .ok()
            .and_then(|p| Timestamp::now().checked_sub(p).ok());
        for obj in store.state() {
            let meta = obj.meta();
            let name = meta.name.as_deref().unwrap_or_default();
            let young = match (&meta.creation_timestamp, grown_up) {
                (Some(created), Some(grown_up)) => created.0 > grown_up,
                _ => false,
            };
            if !young
                && slice_of(meta.namespace.as_deref(), name, slices) == slice
                && to.send(ObjectRef::from_obj(obj.as_ref())).is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    /// A ConfigMap created `age` ago.
    fn object(name: &str, age: SignedDuration) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(Time(Timestamp::now() - age)),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_period_is_cut_into_at_most_sixty_slices_a_second_or_more_apart() {
        assert_eq!(slices(Duration::from_secs(600)), 60);
        assert_eq!(slices(Duration::from_secs(30)), 30);
        assert_eq!(slices(Duration::from_secs(2)), 2);
        assert_eq!(slices(Duration::from_millis(500)), 1);
    }

    #[test]
    fn names_spread_over_the_slices() {
        let mut counts = [0u32; 60];
        for i in 0..6000 {
            counts[slice_of(Some("default"), &format!("demo-md-0-{i}"), 60) as usize] += 1;
        }
        // 100 a slice on average; none empty nor holding several times its share.
        assert!(counts.iter().all(|&c| (50..200).contains(&c)), "{counts:?}");
    }

    /// Each object past its first steps comes round once per period, a new one not yet, and the
    /// loop ends when the controller is gone.
    #[tokio::test(start_paused = true)]
    async fn every_object_is_sent_once_per_period() {
        let mut writer = Writer::<ConfigMap>::default();
        let old = SignedDuration::from_hours(1);
        for i in 0..20 {
            writer.apply_watcher_event(&Event::Apply(object(&format!("m-{i}"), old)));
        }
        // Created now (by the wall clock, which the paused test clock does not move): left to its
        // own changes.
        let young = SignedDuration::ZERO;
        writer.apply_watcher_event(&Event::Apply(object("young", young)));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(resync(writer.as_reader(), Duration::from_secs(10), tx));
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(rx.try_recv().is_err(), "nothing before the first tick");
        // Ten ticks of a second each: every slice once.
        tokio::time::sleep(Duration::from_millis(9_600)).await;
        let mut sent = Vec::new();
        while let Ok(r) = rx.try_recv() {
            sent.push(r.name);
        }
        sent.sort();
        let mut all: Vec<String> = (0..20).map(|i| format!("m-{i}")).collect();
        all.sort();
        assert_eq!(
            sent, all,
            "every object past its first steps exactly once, the new one not"
        );
        drop(rx);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(task.is_finished(), "the loop ends once nobody listens");
    }
}

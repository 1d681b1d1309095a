//! What watchers and readers of the past see: the history of changes, each change dispatched to the
//! watchers whose selection it touches, watches resumed from a revision, and lists at a revision.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::{ObjKey, Store, Stored};
use crate::error::ApiError;
use crate::meta;
use crate::selector::{FieldSelector, LabelSelector};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) rev: u64,
    pub(crate) ty: EventType,
    pub(crate) storage: Arc<str>,
    pub(crate) key: ObjKey,
    pub(crate) obj: Arc<Stored>,
    pub(crate) prev: Option<Arc<Stored>>,
}

impl Event {
    /// The object before this change with this change's resourceVersion (the real watch cache sets
    /// the event's revision on the previous object it sends).
    fn previous_at_rev(&self) -> Arc<Stored> {
        match &self.prev {
            Some(p) => Arc::new(Stored::new(p.value().clone(), self.rev)),
            None => self.obj.clone(),
        }
    }
}

/// What a watcher receives.
#[derive(Debug, Clone)]
pub(crate) enum WatchMsg {
    Event(EventType, Arc<Stored>),
    Bookmark(u64),
    /// The end of the initial events of a `sendInitialEvents` watch.
    InitialEventsEnd(u64),
}

/// Which objects a list or watch selects.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) ns: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.ns
            && meta::meta_str(obj, "namespace") != ns
        {
            return false;
        }
        (self.labels.is_empty() || self.labels.matches(meta::labels(obj)))
            && (self.fields.is_empty() || self.fields.matches(obj))
    }

    /// Like `matches`, without parsing a history copy when only the namespace matters.
    pub(crate) fn matches_stored(&self, key: &ObjKey, obj: &Stored) -> bool {
        if let Some(ns) = &self.ns
            && key.ns != *ns
        {
            return false;
        }
        self.is_trivial() || self.matches(obj.value())
    }

    pub(crate) fn is_trivial(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

pub(super) struct WatcherSlot {
    id: u64,
    filter: Filter,
    tx: mpsc::Sender<WatchMsg>,
    bookmarks: bool,
    /// Only changes after this revision are sent: a watch from a resourceVersion the store has not
    /// reached yet waits for it, as on a real server, instead of getting the changes before it.
    after: u64,
}

impl Store {
    pub(super) fn push_event(
        &mut self,
        ty: EventType,
        storage: &Arc<str>,
        key: ObjKey,
        obj: Arc<Stored>,
        prev: Option<Arc<Stored>>,
    ) {
        let ev = Event {
            rev: obj.rv,
            ty,
            storage: storage.clone(),
            key,
            obj,
            prev,
        };
        // Watchers get the objects with their parsed values; the history keeps bytes-only copies.
        self.dispatch(&ev);
        self.rev_tx.send_replace(ev.rev);
        let kept = Event {
            obj: Arc::new(ev.obj.history_copy()),
            prev: ev.prev.as_ref().map(|p| Arc::new(p.history_copy())),
            ..ev
        };
        self.history.push_back(Arc::new(kept));
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rev;
            }
        }
    }

    fn dispatch(&mut self, ev: &Event) {
        let Some(col) = self.collections.get_mut(&ev.storage) else {
            return;
        };
        let mut closed = 0u64;
        // Built once, for the watchers this change moves out of their selection.
        let mut left: Option<Arc<Stored>> = None;
        col.watchers.retain(|w| {
            if ev.rev <= w.after {
                return true;
            }
            let Some((ty, obj)) = transition(&w.filter, ev) else { return true };
            let obj = match obj {
                Shown::Current => ev.obj.clone(),
                Shown::Previous => left.get_or_insert_with(|| ev.previous_at_rev()).clone(),
            };
            match w.tx.try_send(WatchMsg::Event(ty, obj)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(watcher = w.id, resource = %ev.storage, "closing a watcher that does not keep up");
                    closed += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        self.slow_watchers_closed += closed;
    }

    /// Objects as they were at revision `at` (None = now), in key order, for keys after `after`.
    /// Fails with 410 when the history no longer reaches back to `at`.
    pub(crate) fn snapshot(
        &self,
        storage: &str,
        at: Option<u64>,
        ns: Option<&str>,
        after: Option<&ObjKey>,
        mut f: impl FnMut(&ObjKey, &Arc<Stored>) -> bool,
    ) -> Result<(), ApiError> {
        let Some(col) = self.collections.get(storage) else {
            return Ok(());
        };
        let lower = match (after, ns) {
            (Some(a), _) => std::ops::Bound::Excluded(a.clone()),
            (None, Some(ns)) => std::ops::Bound::Included(ObjKey::new(ns, "")),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let in_ns = |k: &ObjKey| ns.is_none_or(|n| k.ns == n);
        let past_ns = |k: &ObjKey| ns.is_some_and(|n| k.ns.as_str() > n);
        let at = at.filter(|a| *a < self.rev);
        let Some(at) = at else {
            for (k, v) in col.objects.range((lower, std::ops::Bound::Unbounded)) {
                if past_ns(k) {
                    break;
                }
                if in_ns(k) && !f(k, v) {
                    break;
                }
            }
            return Ok(());
        };
        if at < self.compacted {
            return Err(ApiError::gone(format!(
                "too old resource version: {at} ({})",
                self.compacted + 1
            )));
        }
        // The state at `at` is the current one, except for keys changed since: those had the value the
        // first later event found (`prev`), or did not exist.
        let mut overlay: BTreeMap<&ObjKey, Option<&Arc<Stored>>> = BTreeMap::new();
        let first = self.history.partition_point(|e| e.rev <= at);
        for ev in self
            .history
            .range(first..)
            .filter(|e| *e.storage == *storage)
        {
            overlay.entry(&ev.key).or_insert(ev.prev.as_ref());
        }
        let mut current = col
            .objects
            .range((lower.clone(), std::ops::Bound::Unbounded))
            .peekable();
        let mut changed = overlay
            .range::<ObjKey, _>((lower, std::ops::Bound::Unbounded))
            .peekable();
        loop {
            let next_cur = current.peek().map(|(k, _)| *k);
            let next_chg = changed.peek().map(|(k, _)| **k);
            let (key, item): (&ObjKey, Option<&Arc<Stored>>) = match (next_cur, next_chg) {
                (None, None) => break,
                (Some(a), Some(b)) if a == b => {
                    current.next();
                    let Some((k, v)) = changed.next() else { break };
                    (*k, *v)
                }
                (Some(a), Some(b)) if b < a => {
                    let Some((k, v)) = changed.next() else { break };
                    (*k, *v)
                }
                (Some(_), _) => {
                    let Some((k, v)) = current.next() else { break };
                    (k, Some(v))
                }
                (None, Some(_)) => {
                    let Some((k, v)) = changed.next() else { break };
                    (*k, *v)
                }
            };
            if past_ns(key) {
                break;
            }
            if let Some(obj) = item
                && in_ns(key)
                && !f(key, obj)
            {
                break;
            }
        }
        Ok(())
    }

    /// Registers a watcher. The returned backlog holds what happened after `from` (or the current
    /// objects as ADDED when `from` is None), and the channel everything after.
    pub(crate) fn watch(
        &mut self,
        storage: &Arc<str>,
        filter: Filter,
        from: Option<u64>,
        bookmarks: bool,
        initial_events_end: bool,
    ) -> Result<(Vec<WatchMsg>, mpsc::Receiver<WatchMsg>), ApiError> {
        let mut backlog = Vec::new();
        match from {
            None => {
                if let Some(col) = self.collections.get(storage) {
                    let (lower, ns) = match &filter.ns {
                        Some(ns) => (
                            std::ops::Bound::Included(ObjKey::new(ns, "")),
                            Some(ns.as_str()),
                        ),
                        None => (std::ops::Bound::Unbounded, None),
                    };
                    for (k, v) in col.objects.range((lower, std::ops::Bound::Unbounded)) {
                        if ns.is_some_and(|n| k.ns.as_str() > n) {
                            break;
                        }
                        if filter.matches(v.value()) {
                            backlog.push(WatchMsg::Event(EventType::Added, v.clone()));
                        }
                    }
                }
                if initial_events_end {
                    backlog.push(WatchMsg::InitialEventsEnd(self.rev));
                }
            }
            Some(rv) => {
                if rv < self.compacted {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        self.compacted + 1
                    )));
                }
                let first = self.history.partition_point(|e| e.rev <= rv);
                for ev in self
                    .history
                    .range(first..)
                    .filter(|e| e.storage == *storage)
                {
                    if let Some((ty, obj)) = transition(&filter, ev) {
                        let obj = match obj {
                            Shown::Current => ev.obj.clone(),
                            Shown::Previous => ev.previous_at_rev(),
                        };
                        backlog.push(WatchMsg::Event(ty, obj));
                    }
                }
            }
        }
        let (tx, rx) = mpsc::channel(self.watch_buffer);
        self.next_watcher_id += 1;
        let id = self.next_watcher_id;
        match self.collections.get_mut(storage) {
            Some(col) => col.watchers.push(WatcherSlot {
                id,
                filter,
                tx,
                bookmarks,
                after: from.unwrap_or(0),
            }),
            None => return Err(ApiError::path_not_found()),
        }
        Ok((backlog, rx))
    }

    /// Sends a BOOKMARK at the current revision to every watcher that asked for them, and forgets
    /// watchers whose clients went away.
    pub(crate) fn send_bookmarks(&mut self) {
        let rev = self.rev;
        for col in self.collections.values_mut() {
            col.watchers.retain(|w| {
                if w.tx.is_closed() {
                    return false;
                }
                // A watch from a resourceVersion not reached yet gets no bookmark older than it (a
                // client resuming from one would go back before what it asked for).
                if w.bookmarks && rev >= w.after {
                    // A full buffer only skips this bookmark; the next event decides about slowness.
                    let _ = w.tx.try_send(WatchMsg::Bookmark(rev));
                }
                true
            });
        }
    }
}

/// Which version of the object a watcher is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// The object as the change left it.
    Current,
    /// The object before the change, at the change's revision: what a watcher whose selection the
    /// object leaves gets, as from the real watch cache (the last version it matched).
    Previous,
}

/// What a watcher with this filter sees of an event: an object entering the selection is ADDED, one
/// leaving it is DELETED (carrying its previous content, which matched).
fn transition(filter: &Filter, ev: &Event) -> Option<(EventType, Shown)> {
    let now = filter.matches_stored(&ev.key, &ev.obj);
    let before = ev
        .prev
        .as_ref()
        .is_some_and(|p| filter.matches_stored(&ev.key, p));
    match ev.ty {
        EventType::Added => now.then_some((EventType::Added, Shown::Current)),
        EventType::Modified => match (before, now) {
            (true, true) => Some((EventType::Modified, Shown::Current)),
            (false, true) => Some((EventType::Added, Shown::Current)),
            (true, false) => Some((EventType::Deleted, Shown::Previous)),
            (false, false) => None,
        },
        EventType::Deleted => (before || now).then_some((EventType::Deleted, Shown::Current)),
    }
}

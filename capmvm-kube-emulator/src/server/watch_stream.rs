//! A watch's response body: the backlog, then the events as the store sends them, encoded in the
//! format asked for. What is already queued when the body is polled goes out as one chunk: with a
//! line per chunk, a busy server spends its time writing (a writev per chunk per watcher).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Format;
use crate::faults::CutCounter;
use crate::ops::{self, Shared};
use crate::registry::ResourceDef;
use crate::store::{self, EventType, WatchMsg};
use crate::table::{self, IncludeObject};

/// A chunk grows by whole events until it passes this size.
const CHUNK_BYTES: usize = 256 * 1024;

/// A watch to be cut: its connection ends abruptly after `after` events.
pub(super) struct WatchCut {
    pub(super) after: usize,
    pub(super) counter: Option<CutCounter>,
}

pub(super) struct WatchStream {
    shared: Arc<Shared>,
    def: Arc<ResourceDef>,
    backlog: VecDeque<WatchMsg>,
    rx: mpsc::Receiver<WatchMsg>,
    deadline: tokio::time::Instant,
    format: Format,
    include: IncludeObject,
    first: bool,
    /// An injected cut, and the events sent so far.
    cut: Option<WatchCut>,
    sent: usize,
    ended: bool,
}

impl WatchStream {
    pub(super) fn new(
        shared: Arc<Shared>,
        def: Arc<ResourceDef>,
        backlog: Vec<WatchMsg>,
        rx: mpsc::Receiver<WatchMsg>,
        deadline: tokio::time::Instant,
        (format, include): (Format, IncludeObject),
        cut: Option<WatchCut>,
    ) -> Self {
        Self {
            shared,
            def,
            backlog: backlog.into(),
            rx,
            deadline,
            format,
            include,
            first: true,
            cut,
            sent: 0,
            ended: false,
        }
    }

    /// The body's chunks.
    pub(super) fn into_stream(
        self,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        futures::stream::unfold(self, |mut s| async move { s.next().await.map(|b| (b, s)) })
    }

    fn cut_reached(&self) -> bool {
        self.cut.as_ref().is_some_and(|c| self.sent >= c.after)
    }

    /// The next chunk (one event or more), or an error that makes the server drop the connection
    /// (an injected cut).
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.ended {
            return None;
        }
        if let Some(cut) = &self.cut
            && self.sent >= cut.after
        {
            self.ended = true;
            // hyper writes what it has been given only once the body stops being ready: pause, so
            // the events before the cut reach the client before the connection is dropped.
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some(c) = &cut.counter {
                c.record();
            }
            return Some(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "watch cut by the API emulator's fault rules",
            )));
        }
        let first = self.next_line().await?;
        self.sent += 1;
        let mut chunk: Option<Vec<u8>> = None;
        while chunk.as_ref().map_or(first.len(), Vec::len) < CHUNK_BYTES && !self.cut_reached() {
            let Some(msg) = self.queued() else {
                break;
            };
            let line = self.encode(msg);
            chunk
                .get_or_insert_with(|| first.to_vec())
                .extend_from_slice(&line);
            self.sent += 1;
        }
        Some(Ok(chunk.map_or(first, Bytes::from)))
    }

    /// A message that is already there, without waiting.
    fn queued(&mut self) -> Option<WatchMsg> {
        self.backlog.pop_front().or_else(|| self.rx.try_recv().ok())
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        let msg = match self.backlog.pop_front() {
            Some(m) => m,
            None => {
                let mut shutdown = self.shared.shutdown.clone();
                if *shutdown.borrow() {
                    return None;
                }
                tokio::select! {
                    m = self.rx.recv() => m?,
                    () = tokio::time::sleep_until(self.deadline) => return None,
                    _ = shutdown.wait_for(|s| *s) => return None,
                }
            }
        };
        Some(self.encode(msg))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut md = serde_json::Map::new();
        md.insert("resourceVersion".into(), json!(rv.to_string()));
        md.insert("creationTimestamp".into(), Value::Null);
        if initial_end {
            md.insert(
                "annotations".into(),
                json!({"k8s.io/initial-events-end": "true"}),
            );
        }
        let obj =
            json!({"kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": md});
        store::event_line("BOOKMARK", &store::encode(&obj))
    }

    fn encode(&mut self, msg: WatchMsg) -> Bytes {
        match msg {
            WatchMsg::Bookmark(rv) => self.bookmark(rv, false),
            WatchMsg::InitialEventsEnd(rv) => self.bookmark(rv, true),
            WatchMsg::Event(ty, stored) => match self.format {
                Format::Json => match self.def.conversion {
                    crate::registry::Conversion::None => stored.frame(ty),
                    _ => store::event_line(ty.as_str(), &ops::view_bytes(&self.def, &stored)),
                },
                Format::Partial => store::event_line(
                    ty.as_str(),
                    &store::encode(&table::partial_metadata(stored.value())),
                ),
                Format::Table => {
                    let v = ops::view(&self.def, stored.value());
                    let t = table::table(
                        &self.def,
                        std::slice::from_ref(&v),
                        self.include,
                        Some(stored.rv),
                        None,
                        self.first,
                    );
                    self.first = false;
                    store::event_line(event_name(ty), &store::encode(&t))
                }
            },
        }
    }
}

fn event_name(ty: EventType) -> &'static str {
    ty.as_str()
}

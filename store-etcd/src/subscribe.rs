//! [`EtcdSubscription`]: the whole log from a position, caught up by reading the
//! position-numbered keys and then followed live through an etcd watch on `log/`, with no gap and
//! no repeat across the switch.
//!
//! 1. List `log/<delivered+1>..` in pages (batches: one per committed transaction, keyed by its
//!    last position, so the first one holds `delivered + 1`); the page that reaches the end
//!    carries the revision R it was read at.
//! 2. Watch `log/` from R + 1: every batch committed after that read arrives, in commit order.
//! 3. Deliver only position `delivered + 1`; anything at or below `delivered` was already
//!    delivered and is dropped. A jump, a broken stream, a cancelled watch (compaction, lost
//!    leader) or an unreachable member sends it back to step 1 from `delivered`.
//!
//! The watch only ever starts from a revision just read, never from an old one: compaction can
//! remove history, and far-behind watchers stall etcd (etcd-io/etcd#22264).
//!
//! [`vmplane_store::Subscription`] (what `subscribe` on the trait gives) stays the portable one: it
//! reads pages after the head watch says the head moved. This one saves those reads.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::task::JoinHandle;
use vmplane_store::{Error, Position, RecordedEvent, Result};

use crate::EtcdLog;
use crate::codec;
use crate::etcd::Etcd;
use crate::keys::{Keys, prefix_end};

/// Batches read per catch-up request (each holds one committed transaction's events).
const CATCH_UP_PAGE_BATCHES_MAX: i64 = 16;
/// Events buffered between the watch and the reader.
const BUFFER_EVENTS_MAX: usize = 4096;
/// Pause before listing again after a failure.
const RELIST_PAUSE_MS: u64 = 200;

/// Catch-up-then-live reading of the whole log through an etcd watch. Dropping it stops the
/// watch.
pub struct EtcdSubscription {
    events: Receiver<Result<RecordedEvent>>,
    delivered: Position,
    task: JoinHandle<()>,
}

impl EtcdLog {
    /// A subscription delivering every event after `after`: the backlog from the
    /// position-numbered keys, then live events through an etcd watch.
    pub fn watch_from(&self, after: Position) -> Result<EtcdSubscription> {
        let Some(runtime) = &self.runtime else {
            return Err(Error::Unavailable {
                reason: "the etcd log is closed".into(),
            });
        };
        let (sender, events) = std::sync::mpsc::sync_channel(BUFFER_EVENTS_MAX);
        let task = runtime.spawn(follow_log(
            self.etcd.clone(),
            self.keys.clone(),
            after.0,
            self.options.unavailable_after,
            sender,
        ));
        Ok(EtcdSubscription {
            events,
            delivered: after,
            task,
        })
    }
}

impl EtcdSubscription {
    /// The last position delivered (or the starting point).
    #[must_use]
    pub fn position(&self) -> Position {
        self.delivered
    }

    /// The next events, at most `max_count`: at once if some are waiting, otherwise as soon as
    /// one arrives, or an empty list once `timeout` has passed.
    pub fn next_batch(
        &mut self,
        max_count: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedEvent>> {
        let mut batch = Vec::new();
        if max_count == 0 {
            return Ok(batch);
        }
        let first = match self.events.recv_timeout(timeout) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => return Ok(batch),
            Err(RecvTimeoutError::Disconnected) => return Err(closed()),
        };
        batch.push(first?);
        while batch.len() < max_count {
            match self.events.try_recv() {
                Ok(next) => batch.push(next?),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        if let Some(last) = batch.last() {
            self.delivered = last.position;
        }
        Ok(batch)
    }
}

impl Drop for EtcdSubscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn closed() -> Error {
    Error::Unavailable {
        reason: "the etcd subscription stopped (its log was closed)".into(),
    }
}

/// Hands `item` to the reader, waiting while its buffer is full; false once the reader is gone.
async fn deliver(sender: &SyncSender<Result<RecordedEvent>>, item: Result<RecordedEvent>) -> bool {
    let mut item = item;
    loop {
        match sender.try_send(item) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                item = back;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// What to do after a batch.
enum Next {
    Continue,
    /// The reader is gone, or damage was delivered.
    Stop,
    /// The batch starts after `delivered + 1`, or its key is not a batch's.
    Relist,
}

/// Delivers the events of the batch at `kv` after `delivered` (earlier ones were delivered).
async fn deliver_batch(
    keys: &Keys,
    sender: &SyncSender<Result<RecordedEvent>>,
    kv: &etcd_client::KeyValue,
    delivered: &mut u64,
) -> Next {
    let Some(last) = keys.log_position(kv.key()) else {
        return Next::Relist;
    };
    if last <= *delivered {
        return Next::Continue;
    }
    let events = match codec::decode_batch(last, kv.value()) {
        Ok(events) => events,
        Err(err) => {
            deliver(sender, Err(err)).await;
            return Next::Stop;
        }
    };
    for event in events {
        if event.position.0 <= *delivered {
            continue;
        }
        if event.position.0 != *delivered + 1 {
            return Next::Relist;
        }
        let position = event.position.0;
        if !deliver(sender, Ok(event)).await {
            return Next::Stop;
        }
        *delivered = position;
    }
    Next::Continue
}

async fn follow_log(
    etcd: Etcd,
    keys: Keys,
    after: u64,
    unavailable_after: Duration,
    sender: SyncSender<Result<RecordedEvent>>,
) {
    let prefix = keys.log_prefix();
    let end = prefix_end(&prefix);
    let mut delivered = after;
    loop {
        // 1. Catch up from the keys.
        let mut revision = None;
        while revision.is_none() {
            let deadline = Instant::now() + unavailable_after;
            let page = etcd
                .range(
                    "catching up a subscription",
                    deadline,
                    keys.log(delivered + 1),
                    end.clone(),
                    GetOptions::new().with_limit(CATCH_UP_PAGE_BATCHES_MAX),
                )
                .await;
            let page = match page {
                Ok(page) => page,
                Err(failure) => {
                    tracing::warn!(?failure, "etcd subscription: catch-up failed, retrying");
                    tokio::time::sleep(Duration::from_millis(RELIST_PAUSE_MS)).await;
                    continue;
                }
            };
            for kv in page.kvs() {
                match deliver_batch(&keys, &sender, kv, &mut delivered).await {
                    Next::Continue => {}
                    Next::Stop => return,
                    // One read saw a batch that does not follow the last: the log is damaged.
                    Next::Relist => {
                        deliver(
                            &sender,
                            Err(Error::Corrupt {
                                position: Position(delivered + 1),
                                reason: "gap in the log while catching up".into(),
                            }),
                        )
                        .await;
                        return;
                    }
                }
            }
            if (page.kvs().len() as i64) < CATCH_UP_PAGE_BATCHES_MAX {
                revision = Some(page.header().map_or(0, |h| h.revision()));
            }
        }
        // 2. Follow live from just after the last read.
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision.unwrap_or(0) + 1);
        let mut client = etcd.client();
        let created = tokio::time::timeout(
            etcd.request_timeout(),
            client.watch(prefix.clone(), Some(options)),
        )
        .await;
        if let Ok(Ok(mut stream)) = created {
            'live: while let Ok(Some(response)) = stream.message().await {
                if response.canceled() {
                    break;
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    if event.event_type() != EventType::Put {
                        continue;
                    }
                    match deliver_batch(&keys, &sender, kv, &mut delivered).await {
                        Next::Continue => {}
                        Next::Stop => return,
                        // A jump (or a stray key): list again from what was delivered.
                        Next::Relist => break 'live,
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(RELIST_PAUSE_MS)).await;
    }
}

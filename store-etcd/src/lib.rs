//! # vmplane-store-etcd
//!
//! vmplane's event log on etcd: the same [`vmplane_store::EventLog`] trait as the embedded sled
//! backend, over a Raft-replicated etcd cluster, for deployments that outgrow one machine. It
//! passes the same storage contract suite (`vmplane_store::contract_tests!`).
//!
//! It owns the etcd key layout of one log, the group committer, the etcd head watch, and the
//! fault handling `etcd-client` leaves to its caller (deadlines, retries, `require_leader`).
//!
//! ## Main types, in reading order
//!
//! - [`EtcdLog`]: the log; [`EtcdLog::open`] with [`EtcdOptions`] (endpoints, a namespace, the
//!   per-request deadline and how long etcd may be unreachable before appends fail).
//! - [`EtcdLog::LIMITS`]: the bounds, sized so one append always fits one etcd transaction.
//! - [`EtcdSubscription`] ([`EtcdLog::watch_from`]): the log from a position, caught up from the
//!   position-numbered keys, then live through an etcd watch. (The trait's portable
//!   `subscribe` works too: the head watch wakes it.)
//! - [`CommitStats`]: what the committer did (events per transaction, guard failures).
//! - [`IndexStats`] ([`EtcdLog::index_stats`]): what the in-memory index of event ids and
//!   streams holds (events, heap bytes).
//! - [`Election`] ([`EtcdLog::election`]) and [`Term`]: leadership through an etcd lease; a
//!   term's [`Term::fence`] makes [`EventLog::append_fenced`] write only while the term holds.
//! - `harness` (feature `harness`): starts real etcd clusters on free loopback ports for tests
//!   and probes, and stops them again.
//!
//! ## Key layout (under `<namespace>/v1/`)
//!
//! ```text
//! head                               "<pos:020>:<hash hex>:<recorded_at>"  the compare-and-swap word
//! log/<last pos:020>                 one committed transaction's events (a batch), each an
//!                                    envelope (position, stream, revision, id, time, actor,
//!                                    correlation and causation, type, version, payload, prev
//!                                    hash, hash); keyed by its last position          immutable
//! claim/<key>                        owner                    (deleted when released)
//! time/<recorded_at:020>/<pos:020>   ""   one per committed batch, at its first position  immutable
//! leader/<name>                      holder, with the term's lease; create revision = fence token
//! ```
//!
//! There is no key per event id or per stream: each `EtcdLog` keeps those indexes in memory
//! (`index.rs`), built from the batches at open (in the background) and kept current from its
//! own commits and, when another server wrote, by reading the batches after its head. That
//! costs about 80–90 bytes of memory per event ([`EtcdLog::index_stats`]) and saves two etcd
//! operations per append (etcd's cost is per operation). `position_at` is one `limit 1` range over the time index (etcd reads
//! a whole range when asked to sort, so nothing here sorts).
//!
//! A batch is keyed by its last position, so the batch holding position `p` is the first key at
//! or after `log/<p>` (one ascending `limit 1` range), and an append's events are always in one
//! batch. One key per transaction instead of one per event: etcd's cost is per operation.
//!
//! Events live at position-numbered keys that are written once and never overwritten, so etcd's
//! compaction never removes one: compaction keeps every live key's latest value, and only the
//! history of the mutable keys (the head, claims) goes. Positions are gapless and the
//! hash chain is [`vmplane_store::hash::event_hash`], identical to sled's, so a log verifies the
//! same under either backend.
//!
//! ## The committer
//!
//! etcd's revision has gaps, vmplane's positions must not, so every append compares the head
//! key. Racing writers collapse on that word (the reference measured 321 appends/s with 16
//! writers), so each `EtcdLog` has **one committer task** that packs every waiting append into
//! one transaction — within etcd's 128 operations per list and 1.5 MiB per request — guarded by
//! `head == <the head it knows>`. Event ids and stream revisions are decided on the in-memory
//! index, complete at that head: an id it lacks is not in the log at head H, and a transaction
//! guarded by `head == H` commits only if nothing was written since, so no per-id compare is
//! needed. Several servers, each with its own `EtcdLog` on one namespace,
//! stay correct: a failed guard means another server committed; the committer reloads and
//! decides again (details in the `commit` module). Commit transactions go to the leader's
//! endpoint first (found from each member's status, looked for again after a failure and every
//! 10 s; retries use every endpoint). An append returns only after etcd acknowledged the
//! transaction, i.e. after a quorum persisted it.
//!
//! A **fenced** append ([`EventLog::append_fenced`], what the elected reconciler writes with)
//! adds one compare to its group's transaction: `create_revision(leader/<name>) == token`. Only
//! appends with the same fence share a group, so a stale fence fails its own group
//! ([`vmplane_store::Error::Fenced`], nothing written) and never an unfenced writer's append.
//!
//! `pipeline_depth` > 1 keeps several transactions in flight, each compared against the head the
//! one before it will leave; it is correct (tested with two servers breaking each other's
//! pipelines) but off by default: etcd may apply concurrent requests out of order even when they
//! come one after the other over one connection (measured: often, on a loaded 2-core machine),
//! and an overtaking transaction fails its compare. Such a transaction is sent again unchanged
//! once the ones before it committed ([`CommitStats::resent`]), but the failed attempt still
//! cost a raft round, and depth 2 measured slower than 1.
//!
//! ## Faults
//!
//! Every etcd call has a per-request deadline (`request_timeout`) and is retried on transport
//! errors, "no leader" and timeouts; a write whose answer was lost is resent identically and
//! recognized if it had committed. When the cluster has no quorum for `unavailable_after`, the
//! call fails with [`vmplane_store::Error::Unavailable`] naming etcd; nothing acknowledged is ever
//! lost, and an append that failed that way may be retried with the same event ids.
//!
//! ## What it must never do
//!
//! - Interpret a payload (bytes with a type tag and a schema version, as everywhere in `store`).
//! - Rely on etcd revisions or watch history for data: compaction can remove both. A revision is
//!   used only to start a watch just after a read (the head watch, [`EtcdSubscription`]); a watch
//!   cancelled by compaction reads again instead.
//! - Panic on anything etcd returns: damage is [`vmplane_store::Error::Corrupt`] naming the
//!   position, or [`vmplane_store::Error::Damaged`].
//! - Be called from inside an async context: the trait is blocking (use `spawn_blocking`).
//!
//! ## Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use vmplane_store::EventLog;
//! use vmplane_store_etcd::{EtcdLog, EtcdOptions};
//!
//! # fn main() -> Result<(), vmplane_store::Error> {
//! let options = EtcdOptions::new(vec!["http://127.0.0.1:2379".into()], "vmplane/prod");
//! let log: Arc<dyn EventLog> = Arc::new(EtcdLog::open(options)?);
//! println!("head {}", log.head());
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod batches;
mod codec;
mod commit;
mod etcd;
#[cfg(feature = "harness")]
pub mod harness;
mod index;
mod keys;
mod leader;
mod read;
mod subscribe;
mod watch;

pub use leader::{ELECTION_NAME_BYTES_MAX, Election, Term};
pub use subscribe::EtcdSubscription;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use vmplane_store::log::check_request;
use vmplane_store::{
    AppendRequest, AppendResult, Direction, Error, EventLog, Fence, Limits, PayloadValidator,
    Position, RecordedEvent, Result, Revision, Timestamp, VerifyReport, Visitor,
};

use crate::commit::{Committer, Pending};
use crate::etcd::Etcd;
use crate::index::LogIndex;
use crate::keys::{Head, Keys};

/// etcd's default `--max-txn-ops`, and the least [`EtcdOptions::txn_ops_max`] accepts (the
/// largest append needs 19 operations; reads are sent in lists of this size).
pub const DEFAULT_TXN_OPS_MAX: usize = crate::etcd::TXN_OPS_MAX;

/// Bytes in a namespace: it prefixes every key, and a full transaction must stay below etcd's
/// 1.5 MiB request limit.
pub const NAMESPACE_BYTES_MAX: usize = 128;

pub use crate::batches::DEFAULT_BATCH_CACHE_BYTES;

/// How to reach etcd and where the log lives in it.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Client URLs of the members, e.g. `http://10.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// The key prefix of this log (one per vmplane installation), e.g. `vmplane/prod`.
    pub namespace: String,
    /// How long one etcd request may take before it is abandoned and retried.
    pub request_timeout: Duration,
    /// How long etcd may fail to answer before an operation fails with `Unavailable`. For an
    /// append it counts from the moment the append was queued.
    pub unavailable_after: Duration,
    /// Commit transactions the committer keeps in flight at once (at least 1; 1 = each group
    /// waits for the one before it). Default 1: etcd may apply concurrent requests out of
    /// order, and a pipelined transaction that overtakes the one before it fails its head
    /// compare and is sent again; measured slower than 1 here (PERFORMANCE.md). See `commit`.
    pub pipeline_depth: usize,
    /// The most operations the committer puts in each list of one transaction: etcd's
    /// `--max-txn-ops`, which must be at least this on every member (etcd refuses a larger
    /// transaction). Default 128, etcd's default; at least 128. Only claims take operations per
    /// append (events and their ids share the batch's one put), so a higher value pays only
    /// when more than about 120 appends that claim something wait at once.
    pub txn_ops_max: usize,
    /// Bytes of batches already read that this process keeps in memory (decoded), so that
    /// reading the same events again costs etcd nothing: batches never change once committed.
    /// Default [`DEFAULT_BATCH_CACHE_BYTES`]; 0 keeps none.
    pub batch_cache_bytes: usize,
}

impl EtcdOptions {
    /// Defaults: 2 s per request (above etcd's leader election, below its 7 s proposal timeout),
    /// unavailable after 10 s, one commit transaction in flight.
    #[must_use]
    pub fn new(endpoints: Vec<String>, namespace: impl Into<String>) -> EtcdOptions {
        EtcdOptions {
            endpoints,
            namespace: namespace.into(),
            request_timeout: Duration::from_secs(2),
            unavailable_after: Duration::from_secs(10),
            pipeline_depth: 1,
            txn_ops_max: DEFAULT_TXN_OPS_MAX,
            batch_cache_bytes: DEFAULT_BATCH_CACHE_BYTES,
        }
    }
}

/// The head as this process knows it, and the condition [`EventLog::wait_for`] sleeps on.
pub(crate) struct Shared {
    head: vmplane_store::log::DurableHead,
    pub(crate) commits: AtomicU64,
    pub(crate) committed_events: AtomicU64,
    pub(crate) guard_failures: AtomicU64,
    pub(crate) resent: AtomicU64,
    pub(crate) commit_micros: AtomicU64,
}

/// What the committer has done since the log was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Transactions that committed events.
    pub commits: u64,
    /// Events they committed.
    pub events: u64,
    /// Transactions whose head guard failed and were decided again.
    pub guard_failures: u64,
    /// Pipelined transactions etcd applied before the one they follow (so their head guard
    /// failed) and that were sent again unchanged.
    pub resent: u64,
    /// Time spent waiting for etcd on committing transactions, in microseconds.
    pub commit_micros: u64,
}

impl Shared {
    fn new(head: u64) -> Shared {
        Shared {
            head: vmplane_store::log::DurableHead::new(head),
            commits: AtomicU64::new(0),
            committed_events: AtomicU64::new(0),
            guard_failures: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            commit_micros: AtomicU64::new(0),
        }
    }

    pub(crate) fn head(&self) -> u64 {
        self.head.get()
    }

    /// Raises the known head to `position` (never lowers it) and wakes waiters.
    pub(crate) fn publish(&self, position: u64) {
        self.head.publish(position);
    }
}

/// The batches one [`EtcdLog`] keeps after reading them ([`EtcdLog::batch_cache_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCacheStats {
    /// Reads of a batch answered from memory.
    pub hits: u64,
    /// Lookups that found no kept batch (the batch was then read from etcd).
    pub misses: u64,
    /// Bytes kept (an estimate of the decoded events' size).
    pub bytes: u64,
}

/// The in-memory index of one [`EtcdLog`] ([`EtcdLog::index_stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexStats {
    /// The position it is complete up to.
    pub head: Position,
    /// Events indexed.
    pub events: u64,
    /// Heap bytes its tables hold.
    pub heap_bytes: u64,
}

/// vmplane's event log on an etcd cluster. See the crate documentation.
pub struct EtcdLog {
    runtime: Option<Runtime>,
    etcd: Etcd,
    keys: Keys,
    options: EtcdOptions,
    shared: Arc<Shared>,
    /// Event ids and streams up to some head (see `index.rs`); the committer's and the readers'.
    index: Arc<tokio::sync::Mutex<LogIndex>>,
    /// Batches already read (see `batches.rs`).
    pub(crate) batches: batches::BatchCache,
    queue: Option<mpsc::UnboundedSender<Pending>>,
}

impl fmt::Debug for EtcdLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLog")
            .field("endpoints", &self.options.endpoints)
            .field("namespace", &self.options.namespace)
            .field("head", &self.shared.head())
            .finish()
    }
}

impl EtcdLog {
    /// The bounds of this backend. One append always fits one etcd transaction: every claim,
    /// the batch, the head and the time index stay within 128 operations (16 + 3 = 19), and the
    /// largest append (1 MiB of payload plus 50 maximal envelopes) stays below etcd's 1.5 MiB.
    pub const LIMITS: Limits = Limits {
        append_batch_events_max: 50,
        append_claims_max: 16,
        event_payload_bytes_max: 1 << 20,
        append_payload_bytes_max: 1 << 20,
        stream_name_bytes_max: 512,
        event_type_bytes_max: 128,
        actor_bytes_max: 256,
        claim_bytes_max: 512,
        read_events_max: 10_000,
    };

    /// Connects to etcd, reads the log's head (an empty namespace is an empty log) and starts the
    /// committer and the head watch. Fails with [`Error::Unavailable`] if etcd does not answer
    /// within `unavailable_after`.
    pub fn open(options: EtcdOptions) -> Result<EtcdLog> {
        if options.endpoints.is_empty() {
            return Err(Error::InvalidRequest {
                reason: "no etcd endpoints given".into(),
            });
        }
        if let Some(url) = options
            .endpoints
            .iter()
            .find(|e| e.trim().to_ascii_lowercase().starts_with("https://"))
        {
            return Err(Error::Misconfigured {
                reason: format!(
                    "etcd endpoint {url}: TLS to etcd is not supported by this build; use \
                     http:// on a trusted network"
                ),
            });
        }
        if options.namespace.trim_matches('/').is_empty() {
            return Err(Error::InvalidRequest {
                reason: "the etcd namespace of the log is empty".into(),
            });
        }
        if options.txn_ops_max < DEFAULT_TXN_OPS_MAX {
            return Err(Error::InvalidRequest {
                reason: format!(
                    "txn_ops_max {} is below etcd's default --max-txn-ops {DEFAULT_TXN_OPS_MAX}",
                    options.txn_ops_max
                ),
            });
        }
        if options.namespace.len() > NAMESPACE_BYTES_MAX {
            return Err(Error::LimitExceeded {
                limit: "namespace_bytes_max",
                max: NAMESPACE_BYTES_MAX as u64,
                actual: options.namespace.len() as u64,
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("vmplane-etcd")
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                context: "starting the etcd client runtime",
                source,
            })?;
        let keys = Keys::new(&options.namespace);
        let deadline = Instant::now() + options.unavailable_after;
        let (etcd, head, revision) = runtime.block_on(async {
            let etcd = Etcd::connect(&options.endpoints, options.request_timeout).await?;
            let response = etcd
                .retry("reading the log's head", deadline, |mut kv| {
                    let key = keys.head();
                    async move { kv.get(key, None).await }
                })
                .await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let head = match response.kvs().first() {
                Some(kv) => Head::decode(kv.value())?,
                None => Head::EMPTY,
            };
            Ok::<_, Error>((etcd, head, revision))
        })?;
        runtime.block_on(refuse_nested(&etcd, &keys, &options.namespace, deadline))?;
        let shared = Arc::new(Shared::new(head.position));
        let index = Arc::new(tokio::sync::Mutex::new(LogIndex::new()));
        // Index the log in the background: the first append or stream read waits for it (a
        // failure here is retried by whoever needs the index next).
        {
            let (etcd, keys, index) = (etcd.clone(), keys.clone(), Arc::clone(&index));
            let unavailable_after = options.unavailable_after;
            runtime.spawn(async move {
                let started = Instant::now();
                let mut index = index.lock().await;
                match index.catch_up(&etcd, &keys, head, unavailable_after).await {
                    Ok(()) => tracing::debug!(
                        events = index.len(),
                        took_ms = started.elapsed().as_millis() as u64,
                        "indexed the etcd log"
                    ),
                    Err(err) => tracing::warn!(%err, "indexing the etcd log at open failed; retried on first use"),
                }
            });
        }
        let (queue, receiver) = mpsc::unbounded_channel();
        let committer = Committer::new(
            etcd.clone(),
            keys.clone(),
            options.clone(),
            Arc::clone(&shared),
            Arc::clone(&index),
            head,
        );
        runtime.spawn(committer.run(receiver));
        runtime.spawn(watch::follow_head(
            etcd.clone(),
            keys.head(),
            revision + 1,
            Arc::clone(&shared),
        ));
        tracing::debug!(namespace = %options.namespace, head = head.position, "opened the etcd log");
        let batches = batches::BatchCache::new(options.batch_cache_bytes);
        Ok(EtcdLog {
            runtime: Some(runtime),
            etcd,
            keys,
            options,
            shared,
            index,
            batches,
            queue: Some(queue),
        })
    }

    /// Group-commit figures since open (events per transaction = `events / commits`).
    #[must_use]
    pub fn commit_stats(&self) -> CommitStats {
        CommitStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            events: self.shared.committed_events.load(Ordering::Relaxed),
            guard_failures: self.shared.guard_failures.load(Ordering::Relaxed),
            resent: self.shared.resent.load(Ordering::Relaxed),
            commit_micros: self.shared.commit_micros.load(Ordering::Relaxed),
        }
    }

    /// Whether etcd answered lately: false once an operation has gone unanswered for longer
    /// than [`EtcdOptions::request_timeout`], true again at the next answer. Each change is
    /// logged once (WARN, then INFO), an outage again every 30 s.
    #[must_use]
    pub fn backend_up(&self) -> bool {
        self.etcd.reachable()
    }

    /// Batches kept in memory after a read (see [`EtcdOptions::batch_cache_bytes`]).
    #[must_use]
    pub fn batch_cache_stats(&self) -> BatchCacheStats {
        BatchCacheStats {
            hits: self.batches.hits.load(Ordering::Relaxed),
            misses: self.batches.misses.load(Ordering::Relaxed),
            bytes: self.batches.bytes() as u64,
        }
    }

    /// What this server's in-memory index of event ids and streams holds (see the crate
    /// documentation): waits for it if it is being built.
    pub fn index_stats(&self) -> Result<IndexStats> {
        self.block(async {
            let index = self.index.lock().await;
            IndexStats {
                head: Position(index.head().position),
                events: index.len() as u64,
                heap_bytes: index.heap_bytes() as u64,
            }
        })
    }

    /// Leadership `name` of this log (e.g. `reconciler`), campaigned for as `holder` (shown to
    /// operators in the key's value) with leases of `ttl`. See [`Election::campaign`]; a term's
    /// [`Term::fence`] is what [`EventLog::append_fenced`] checks.
    pub fn election(
        &self,
        name: &str,
        ttl: Duration,
        holder: impl Into<String>,
    ) -> Result<Election> {
        let Some(runtime) = &self.runtime else {
            return Err(Error::Unavailable {
                reason: "the etcd log is closed".into(),
            });
        };
        Election::new(
            runtime.handle().clone(),
            self.etcd.clone(),
            &self.keys,
            name,
            holder.into(),
            ttl,
        )
    }

    /// The options it was opened with.
    #[must_use]
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    fn block<T>(&self, future: impl Future<Output = T>) -> Result<T> {
        match &self.runtime {
            Some(runtime) => Ok(runtime.block_on(future)),
            None => Err(Error::Unavailable {
                reason: "the etcd log is closed".into(),
            }),
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.options.unavailable_after
    }
}

/// Refuses a namespace whose keys overlap another vmplane log's: one whose `<prefix>/v1/`
/// holds this one (an ancestor `A` with `namespace = A/v1/…` whose head key `A/v1/head`
/// exists), or one nested in this log's own `log/` or `time/` ranges (a key there that is not a
/// position). Either way one log's keys would be read as the other's, and the log that holds the
/// other's range breaks ("a malformed key under log/").
async fn refuse_nested(etcd: &Etcd, keys: &Keys, namespace: &str, deadline: Instant) -> Result<()> {
    use crate::keys::prefix_end;
    use etcd_client::GetOptions;
    let spelled = format!("{}/", namespace.trim_end_matches('/'));
    let ancestors: Vec<String> = spelled
        .match_indices("/v1/")
        .map(|(i, _)| spelled[..i].to_owned())
        .filter(|a| !a.is_empty())
        .collect();
    let mut reads: Vec<(Vec<u8>, Option<GetOptions>)> = ancestors
        .iter()
        .map(|a| (format!("{a}/v1/head").into_bytes(), None))
        .collect();
    // Batch and time keys are digits: anything after `log/9…` or `time/9…` is not this log's.
    for sub in ["log/", "time/"] {
        let range = format!("{}{sub}", keys.root()).into_bytes();
        let mut from = range.clone();
        from.push(b'9' + 1);
        reads.push((
            from,
            Some(
                GetOptions::new()
                    .with_range(prefix_end(&range))
                    .with_limit(1)
                    .with_keys_only(),
            ),
        ));
    }
    let found = etcd
        .read_many("checking the namespace", deadline, reads)
        .await?;
    for (ancestor, kvs) in ancestors.iter().zip(&found) {
        if !kvs.is_empty() {
            return Err(Error::Misconfigured {
                reason: format!(
                    "etcd namespace {namespace:?} (vmplane serve --etcd-prefix) lies inside the \
                     keys of another vmplane log, {ancestor:?} (its head key {ancestor}/v1/head \
                     exists): its keys would be written among that log's and break it; choose a \
                     prefix outside every other installation's <prefix>/v1/"
                ),
            });
        }
    }
    if let Some(kv) = found[ancestors.len()..].iter().find_map(|kvs| kvs.first()) {
        return Err(Error::Misconfigured {
            reason: format!(
                "etcd namespace {namespace:?} holds a key that is not this log's, {:?}: another \
                 vmplane log's prefix (vmplane serve --etcd-prefix) lies inside this one's \
                 {}; move that installation to a prefix of its own",
                String::from_utf8_lossy(kv.key()),
                keys.root()
            ),
        });
    }
    Ok(())
}

impl Drop for EtcdLog {
    fn drop(&mut self) {
        // Closing the queue ends the committer once it has answered what it holds.
        self.queue.take();
        if let Some(runtime) = self.runtime.take() {
            // Does not block, so dropping the log inside an async context is fine too.
            runtime.shutdown_background();
        }
    }
}

impl EtcdLog {
    fn queue_append(&self, request: AppendRequest, fence: Option<Fence>) -> Result<AppendResult> {
        check_request(&Self::LIMITS, &request)?;
        let Some(queue) = &self.queue else {
            return Err(Error::Unavailable {
                reason: "the etcd log is closed".into(),
            });
        };
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            request,
            fence,
            arrived: Instant::now(),
            reply,
        };
        if queue.send(pending).is_err() {
            return Err(Error::Unavailable {
                reason: "the etcd committer has stopped".into(),
            });
        }
        answer.blocking_recv().unwrap_or_else(|_| {
            Err(Error::Unavailable {
                reason: "the etcd committer stopped before answering".into(),
            })
        })
    }
}

impl EventLog for EtcdLog {
    fn append(&self, request: AppendRequest) -> Result<AppendResult> {
        self.queue_append(request, None)
    }

    /// The fence is one more compare in the group's transaction: `create_revision` of
    /// `<namespace>/v1/leader/<name>` equals the token. Fenced appends are grouped only with
    /// appends carrying the same fence.
    fn append_fenced(&self, request: AppendRequest, fence: &Fence) -> Result<AppendResult> {
        self.queue_append(request, Some(fence.clone()))
    }

    fn read_stream(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        self.block(self.read_stream_inner(stream, from, direction, max_count))?
    }

    fn read_all(&self, after: Position, max_count: usize) -> Result<Vec<RecordedEvent>> {
        let max_count = max_count.min(Self::LIMITS.read_events_max);
        self.block(self.read_range(after.0, max_count as u64))?
    }

    fn scan(&self, after: Position, visit: Visitor<'_>) -> Result<Position> {
        self.block(self.scan_inner(after.0, visit))?
    }

    fn read_event(&self, position: Position) -> Result<Option<RecordedEvent>> {
        if position.0 == 0 {
            return Ok(None);
        }
        Ok(self
            .block(self.read_range(position.0 - 1, 1))??
            .into_iter()
            .next())
    }

    fn position_at(&self, at: Timestamp) -> Result<Position> {
        self.block(self.position_at_inner(at))?
    }

    fn head(&self) -> Position {
        Position(self.shared.head())
    }

    fn wait_for(&self, position: Position, timeout: Duration) -> Result<Position> {
        Ok(self.shared.head.wait_for(position, timeout))
    }

    fn stream_revision(&self, stream: &str) -> Result<Option<Revision>> {
        self.block(self.stream_revision_inner(stream))?
    }

    fn claim_holder(&self, key: &str) -> Result<Option<String>> {
        self.block(self.claim_holder_inner(key))?
    }

    fn verify(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport> {
        self.block(self.verify_inner(validate_payload))?
    }

    fn limits(&self) -> &Limits {
        &Self::LIMITS
    }
}

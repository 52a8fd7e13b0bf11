//! The committer: one task per [`crate::EtcdLog`] that turns concurrent appends into one etcd
//! transaction per group (group commit), guarded by the global head key.
//!
//! Appenders queue their requests and sleep. The committer takes the first request and every
//! other one already waiting, as long as the group fits one transaction (at most
//! `txn_ops_max` entries, by default etcd's 128, in each of its compare, success and failure
//! lists and about 1.2 MB in all; etcd refuses more than its `--max-txn-ops` and 1.5 MiB).
//! etcd's cost is per operation in a transaction (each put costs about as much as a
//! kilobyte-sized batch of bodies), so a transaction has as few operations as possible: one put
//! for all the group's events, the claim changes, the time index and the head; one compare (two
//! when fenced). Event ids and stream revisions are not keys in etcd: they are decided on the
//! in-memory [`LogIndex`], complete up to the head it is at. It then:
//!
//! 1. makes sure the index and the claim cache are valid at the head it knows: the head and the
//!    claims it lacks are read in one transaction; if the head moved (another server committed,
//!    or an outcome was unknown) the claim cache is dropped and the index reads the batches up
//!    to the new head;
//! 2. decides each request in order against the index and the claim cache plus the effects of
//!    the requests before it (a rejected request fails alone), exactly as the sled backend
//!    does;
//! 3. sends one `Txn`: **if** `head == <known head>` (and, for a fenced group, the leader key's
//!    create revision is the fence's token) **then** put the batch of every event at
//!    `log/<last pos>`, the claim changes, the time index and the new head; **else** get the
//!    head, `log/<last pos>` (and the leader key). No id or stream is compared: the index is
//!    complete at head H, so an id it lacks is not in the log at H, and nothing can be written
//!    between H and a transaction that commits only while the head is H;
//! 4. on success takes the group into the index and publishes the head; on failure learns
//!    that its own earlier attempt had committed, that the fence is stale, or that another
//!    server wrote (the index catches up), and tries again. A request whose outcome stayed
//!    unknown (the transaction timed out) is resent *identically*: if it had committed,
//!    `log/<last pos>` holds its batch and the group succeeds.
//!
//! Commit transactions go to the leader's endpoint first (`Etcd::pinned`).
//!
//! Every group has a deadline (its oldest request's arrival plus `unavailable_after`); past it
//! the group fails with [`Error::Unavailable`] naming etcd.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};
use tokio::sync::{mpsc, oneshot};
use vmplane_store::Timestamp;
use vmplane_store::hash::event_hash;
use vmplane_store::log::decide_append;
use vmplane_store::{
    AppendRequest, AppendResult, Error, Fence, Position, RecordedEventRef, Result,
};
// How one request was decided: the same outcomes on every backend.
use vmplane_store::log::AppendDecision as Decision;

use crate::codec;
use crate::etcd::{Etcd, Failure, gets};
use crate::index::LogIndex;
use crate::keys::{Head, IdLocation, Keys};
use crate::{EtcdOptions, Shared};

/// Bytes one group's transaction may carry (etcd refuses requests over 1.5 MiB).
pub(crate) const GROUP_BYTES_MAX: usize = 1_200_000;
/// Times a pipelined transaction is sent again after being overtaken by the one before it.
const OVERTAKEN_RESENDS_MAX: u32 = 4;
/// Own heads remembered (see `Committer::own_heads`).
const OWN_HEADS_MAX: usize = 64;
/// How often the committer looks for the leader's endpoint again (leadership moves).
const REPIN_EVERY: Duration = Duration::from_secs(10);
/// Times a group is decided again after the head moved under it before giving up.
const GUARD_RETRIES_MAX: u32 = 64;

/// One queued append.
pub(crate) struct Pending {
    pub request: AppendRequest,
    /// Leadership the append must still hold when it commits: a group holds only appends with
    /// the same fence (or none), so a stale fence fails its own group and nobody else's.
    pub fence: Option<Fence>,
    pub arrived: Instant,
    pub reply: oneshot::Sender<Result<AppendResult>>,
}

// The effects of the requests accepted so far in a group (or of the groups in flight), on top
// of the index and the claim cache: the store's shared form.
use vmplane_store::log::Overlay;

/// What one transaction would write, kept to apply it once etcd says yes.
struct Plan {
    txn: Txn,
    /// The head once it commits; its hash is the batch's last event's, which tells this very
    /// batch from any other written at the same key.
    head: Head,
}

/// The committer's state: the head it knows, and the index and claims valid at that head.
pub(crate) struct Committer {
    /// Pinned to the leader's endpoint (see `Etcd::pinned`), looked for again after a failure
    /// and every `REPIN_EVERY`.
    etcd: Etcd,
    pinned_at: Option<Instant>,
    keys: Keys,
    options: EtcdOptions,
    shared: Arc<Shared>,
    /// The head the next group is decided on: the index's, or the last in-flight group's.
    head: Head,
    /// The cache may no longer match `head` (another server wrote, or an outcome is unknown).
    stale: bool,
    /// Ids and streams, committed; shared with readers (`EtcdLog::index_at`), who may move it
    /// past `head` by reading batches, never back.
    index: Arc<tokio::sync::Mutex<LogIndex>>,
    /// Claim holders read at `head` (or written by this committer since).
    claims: HashMap<String, Option<String>>,
    /// The effects of the groups in flight (decided, not yet known to be committed): the next
    /// group is decided on them. Emptied when the pipeline drains or breaks.
    speculative: Overlay,
    /// Heads this committer's own commits (committed or in flight) went through, oldest first,
    /// ending at `head`: nobody else committed between them. Reset when another server commits.
    own_heads: VecDeque<Head>,
}

/// How much of one transaction a group uses.
#[derive(Default)]
struct Budget {
    success_ops: usize,
    compares: usize,
    reads: usize,
    bytes: usize,
}

impl Budget {
    fn cost(request: &AppendRequest) -> Budget {
        let bytes: usize = request
            .events
            .iter()
            .map(|e| {
                e.payload.len()
                    + e.actor.len()
                    + e.event_type.len()
                    + 3 * request.stream.len()
                    + 400
            })
            .sum::<usize>()
            + request
                .claims
                .iter()
                .map(|c| 2 * (c.key().len() + c.owner().len()) + 64)
                .sum::<usize>();
        Budget {
            // one per claim key (events and their ids are in the batch)
            success_ops: request.claims.len(),
            // none per event: ids and revisions are decided on the index
            compares: 0,
            // each claim, when not cached
            reads: request.claims.len(),
            bytes,
        }
    }

    /// Whether `more` still fits in a transaction of at most `ops_max` operations per list;
    /// the first request of a group always does.
    fn fits(&self, more: &Budget, ops_max: usize) -> bool {
        // Fixed per transaction: the batch, head and time index puts; head compare; head and
        // batch gets.
        self.success_ops + more.success_ops + 3 <= ops_max
            && self.compares + more.compares + 2 <= ops_max
            && self.reads + more.reads < ops_max
            && self.bytes + more.bytes <= GROUP_BYTES_MAX
    }

    fn add(&mut self, more: Budget) {
        self.success_ops += more.success_ops;
        self.compares += more.compares;
        self.reads += more.reads;
        self.bytes += more.bytes;
    }
}

impl Committer {
    pub(crate) fn new(
        etcd: Etcd,
        keys: Keys,
        options: EtcdOptions,
        shared: Arc<Shared>,
        index: Arc<tokio::sync::Mutex<LogIndex>>,
        head: Head,
    ) -> Committer {
        Committer {
            etcd: etcd.pinned(),
            pinned_at: None,
            keys,
            options,
            shared,
            head,
            stale: false,
            index,
            claims: HashMap::new(),
            speculative: Overlay::default(),
            own_heads: VecDeque::from([head]),
        }
    }

    /// `head` is this committer's own next head (sent or committed).
    fn own_head(&mut self, head: Head) {
        self.own_heads.push_back(head);
        while self.own_heads.len() > OWN_HEADS_MAX {
            self.own_heads.pop_front();
        }
    }

    /// Someone else may have committed: only `head` (just read) is known.
    fn reset_own_heads(&mut self, head: Head) {
        self.own_heads.clear();
        self.own_heads.push_back(head);
    }

    /// Commits groups until every sender is gone, keeping up to `pipeline_depth` transactions
    /// in flight: group N+1 is decided and sent on the state group N will leave (its head
    /// compare names N's new head), so etcd's raft can commit them in one round. When a
    /// transaction in the pipeline fails, every later one was decided on a state that did not
    /// happen: they are settled one by one (a later one that committed anyway is acknowledged,
    /// the others are decided again on a fresh read), so positions stay gapless and the chain
    /// intact. A transaction that failed only because etcd applied it before the one it follows
    /// (its failure branch found an earlier head of this committer's own) is sent again
    /// unchanged. Anything off the fast path (a claim not cached, a rejected
    /// request, another server's commit) drains the pipeline and commits alone.
    pub(crate) async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Pending>) {
        let mut carried: Option<Pending> = None;
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        loop {
            self.keep_pinned();
            let room = in_flight.len() < self.options.pipeline_depth.max(1);
            let first = match carried.take() {
                Some(pending) if room => Some(pending),
                Some(pending) => {
                    carried = Some(pending);
                    None
                }
                None if in_flight.is_empty() => match queue.recv().await {
                    Some(pending) => Some(pending),
                    None => return,
                },
                None if room => queue.try_recv().ok(),
                None => None,
            };
            let Some(first) = first else {
                self.complete_oldest(&mut in_flight).await;
                continue;
            };
            let mut budget = Budget::default();
            budget.add(Budget::cost(&first.request));
            let mut group = vec![first];
            while let Ok(next) = queue.try_recv() {
                let cost = Budget::cost(&next.request);
                if next.fence == group[0].fence && budget.fits(&cost, self.options.txn_ops_max) {
                    budget.add(cost);
                    group.push(next);
                } else {
                    carried = Some(next);
                    break;
                }
            }
            let fence = group[0].fence.clone();
            let deadline = group
                .iter()
                .map(|p| p.arrived)
                .min()
                .unwrap_or_else(Instant::now)
                + self.options.unavailable_after;
            let group = match self
                .try_pipeline(group, fence.clone(), deadline, in_flight.len())
                .await
            {
                Ok(flight) => {
                    in_flight.push_back(flight);
                    continue;
                }
                Err(group) => group,
            };
            while !in_flight.is_empty() {
                self.complete_oldest(&mut in_flight).await;
            }
            let requests: Vec<&AppendRequest> = group.iter().map(|p| &p.request).collect();
            let results = self.commit_group(&requests, fence.as_ref(), deadline).await;
            reply(group, results);
        }
    }

    /// Looks for the leader's endpoint in the background when the pinned connection failed,
    /// none was found yet, or the last search is old.
    fn keep_pinned(&mut self) {
        let old = self.pinned_at.is_none_or(|at| at.elapsed() >= REPIN_EVERY);
        let recent = self
            .pinned_at
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        if !recent && self.etcd.should_repin(old) {
            self.pinned_at = Some(Instant::now());
            let etcd = self.etcd.clone();
            tokio::spawn(async move { etcd.repin().await });
        }
    }

    /// The fast path: when the index is at the committer's head (or the groups in flight lead
    /// there from it), every claim of the group is cached and every request is accepted,
    /// decides it on the state the transactions in flight will leave, sends its transaction
    /// and takes its effects into `speculative` at once. Hands the group back otherwise.
    async fn try_pipeline(
        &mut self,
        group: Vec<Pending>,
        fence: Option<Fence>,
        deadline: Instant,
        in_flight: usize,
    ) -> std::result::Result<InFlight, Vec<Pending>> {
        if self.stale || self.shared.head() > self.head.position {
            return Err(group);
        }
        let cached = group.iter().all(|p| {
            p.request.claims.iter().all(|c| {
                self.speculative.claims.contains_key(c.key()) || self.claims.contains_key(c.key())
            })
        });
        if !cached {
            return Err(group);
        }
        let index = Arc::clone(&self.index);
        let index = index.lock().await;
        if in_flight == 0 && index.head() != self.head {
            // A reader moved the index past this committer's head: the slow path reloads.
            return Err(group);
        }
        let mut overlay = Overlay {
            next_position: self.head.position + 1,
            ..Overlay::default()
        };
        let mut decisions = Vec::with_capacity(group.len());
        for pending in &group {
            let decision = self.decide(&index, &overlay, &pending.request);
            match &decision {
                Decision::Accept {
                    first_revision,
                    first_position,
                    claims,
                    ..
                } => overlay.accept(&pending.request, *first_revision, *first_position, claims),
                Decision::Replay(_) => {}
                Decision::Reject(_) => return Err(group),
            }
            decisions.push(decision);
        }
        drop(index);
        if overlay.next_position == self.head.position + 1 {
            return Err(group);
        }
        let requests: Vec<&AppendRequest> = group.iter().map(|p| &p.request).collect();
        let plan = self.plan(&requests, &decisions, &overlay, fence.as_ref());
        let base = self.head;
        let txn = plan.txn;
        let response = send(&self.etcd, deadline, txn.clone());
        let events = overlay.ids.len() as u64;
        // Speculatively committed: the next group is decided after this one.
        self.head = plan.head;
        self.own_head(plan.head);
        self.speculative.absorb(overlay);
        Ok(InFlight {
            group,
            fence,
            deadline,
            decisions,
            base,
            txn,
            resent: 0,
            head: plan.head,
            events,
            sent: Instant::now(),
            response,
        })
    }

    /// Waits for the oldest transaction in flight and answers its group. If it did not commit,
    /// settles every later one too (they were decided on its success).
    async fn complete_oldest(&mut self, in_flight: &mut VecDeque<InFlight>) {
        let Some(mut flight) = in_flight.pop_front() else {
            return;
        };
        let response = flight.wait().await;
        self.shared
            .commit_micros
            .fetch_add(flight.sent.elapsed().as_micros() as u64, Ordering::Relaxed);
        if let Ok(r) = &response
            && !r.succeeded()
            && flight.resent < OVERTAKEN_RESENDS_MAX
            && self.overtaken(&flight, r)
        {
            // Every transaction before it committed (they completed first), so the head it
            // was decided on is there now, unless another server wrote: send it again as is.
            flight.resent += 1;
            self.shared.resent.fetch_add(1, Ordering::Relaxed);
            flight.response = send(&self.etcd, flight.deadline, flight.txn.clone());
            in_flight.push_front(flight);
            return;
        }
        if let Ok(r) = &response
            && r.succeeded()
        {
            self.answer_committed(flight).await;
        } else {
            // The pipeline is broken: nothing decided after this transaction can be trusted.
            self.stale = true;
            self.speculative = Overlay::default();
            let mut broken = vec![(flight, response)];
            while let Some(mut later) = in_flight.pop_front() {
                let response = later.wait().await;
                broken.push((later, response));
            }
            for (flight, response) in broken {
                self.settle(flight, response).await;
            }
        }
        if in_flight.is_empty() {
            // Everything decided is in the index now (or the committer is stale).
            self.speculative = Overlay::default();
        }
    }

    /// Whether `flight` failed only because etcd applied it before a transaction of its own
    /// pipeline that it follows (etcd may reorder requests that are in flight together, even on
    /// one connection): the head it found is one of this committer's own, short of its base.
    fn overtaken(&self, flight: &InFlight, response: &TxnResponse) -> bool {
        let found = match gets(response).first().cloned().flatten() {
            Some(kv) => Head::decode(kv.value()),
            None => Ok(Head::EMPTY),
        };
        match found {
            Ok(found) => found.position < flight.base.position && self.own_heads.contains(&found),
            Err(_) => false,
        }
    }

    /// The flight's transaction committed: its effects go into the index and its group is
    /// answered.
    async fn answer_committed(&mut self, flight: InFlight) {
        let requests: Vec<&AppendRequest> = flight.group.iter().map(|p| &p.request).collect();
        self.index_committed(&requests, &flight.decisions, flight.head)
            .await;
        self.committed(&flight);
        let results = flight
            .decisions
            .into_iter()
            .map(Decision::into_result)
            .collect();
        reply(flight.group, results);
    }

    /// Answers a group whose transaction may not have committed.
    async fn settle(&mut self, flight: InFlight, response: Result<TxnResponse, Failure>) {
        let response = match response {
            Ok(response) if response.succeeded() => {
                // A later transaction committed: the one before it had committed after all.
                self.answer_committed(flight).await;
                return;
            }
            other => other,
        };
        // Its effects are not known to be in etcd: the index never had them, and the committer
        // is stale already (the next load reads the head and catches the index up).
        match response {
            Err(failure) => {
                let results = unknown_outcome(flight.decisions, &failure);
                reply(flight.group, results);
            }
            Ok(response) => {
                self.shared.guard_failures.fetch_add(1, Ordering::Relaxed);
                let values = gets(&response);
                let ours = values
                    .get(1)
                    .cloned()
                    .flatten()
                    .and_then(|kv| codec::batch_last_hash(kv.value()))
                    == Some(flight.head.hash);
                if ours {
                    // An earlier attempt of this very transaction committed (answer lost).
                    self.answer_committed(flight).await;
                    return;
                }
                let requests: Vec<&AppendRequest> =
                    flight.group.iter().map(|p| &p.request).collect();
                let results = self
                    .commit_group(&requests, flight.fence.as_ref(), flight.deadline)
                    .await;
                reply(flight.group, results);
            }
        }
    }

    /// A transaction of the pipeline committed: count it and publish its head.
    fn committed(&self, flight: &InFlight) {
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
        self.shared
            .committed_events
            .fetch_add(flight.events, Ordering::Relaxed);
        self.shared.publish(flight.head.position);
    }

    /// Decides and commits one group; returns each request's result, in order.
    async fn commit_group(
        &mut self,
        group: &[&AppendRequest],
        fence: Option<&Fence>,
        deadline: Instant,
    ) -> Vec<Result<AppendResult>> {
        let mut guard_failures = 0u32;
        loop {
            if self.shared.head() > self.head.position {
                // The head watch saw another server's commit.
                self.stale = true;
            }
            if let Err(failure) = self.load(group, deadline).await {
                self.stale = true;
                return group
                    .iter()
                    .map(|_| Err(failure.clone().into_error()))
                    .collect();
            }
            let mut overlay = Overlay {
                next_position: self.head.position + 1,
                ..Overlay::default()
            };
            let index = Arc::clone(&self.index);
            let index = index.lock().await;
            let decisions: Vec<Decision> = group
                .iter()
                .map(|request| {
                    let decision = self.decide(&index, &overlay, request);
                    if let Decision::Accept {
                        first_revision,
                        first_position,
                        claims,
                        ..
                    } = &decision
                    {
                        overlay.accept(request, *first_revision, *first_position, claims);
                    }
                    decision
                })
                .collect();
            drop(index);
            if overlay.next_position == self.head.position + 1 {
                return decisions.into_iter().map(Decision::into_result).collect();
            }
            let plan = self.plan(group, &decisions, &overlay, fence);
            let sent = Instant::now();
            let response = self
                .etcd
                .txn("committing appends", deadline, plan.txn.clone())
                .await;
            self.shared
                .commit_micros
                .fetch_add(sent.elapsed().as_micros() as u64, Ordering::Relaxed);
            let response = match response {
                Ok(response) => response,
                Err(failure) => {
                    // The outcome of the last attempt is unknown: the appenders retry with the
                    // same event ids, which the idempotency rule makes safe.
                    self.stale = true;
                    return unknown_outcome(decisions, &failure);
                }
            };
            if response.succeeded() {
                self.apply(group, &decisions, plan.head, overlay.ids.len() as u64)
                    .await;
                return decisions.into_iter().map(Decision::into_result).collect();
            }
            // The guard failed: the failure list read the head, log/<first pos> (and the fence).
            self.shared.guard_failures.fetch_add(1, Ordering::Relaxed);
            let values = gets(&response);
            let found_head = match values.first().cloned().flatten() {
                Some(kv) => Head::decode(kv.value()),
                None => Ok(Head::EMPTY),
            };
            let ours = values
                .get(1)
                .cloned()
                .flatten()
                .and_then(|kv| codec::batch_last_hash(kv.value()))
                == Some(plan.head.hash);
            if ours {
                // An earlier attempt of this very transaction committed (its answer was lost).
                let moved_on = found_head
                    .as_ref()
                    .map(|h| h.position > plan.head.position)
                    .unwrap_or(true);
                self.apply(group, &decisions, plan.head, overlay.ids.len() as u64)
                    .await;
                self.stale |= moved_on;
                return decisions.into_iter().map(Decision::into_result).collect();
            }
            if let Some(fence) = fence {
                let key = self.keys.fence(&fence.name);
                let current = values
                    .iter()
                    .flatten()
                    .find(|kv| kv.key() == key.as_slice())
                    .map(|kv| kv.create_revision() as u64);
                if current != Some(fence.token) {
                    // The leadership term is over: every accepted append of this group carried
                    // that fence; none was written.
                    return decisions
                        .into_iter()
                        .zip(group)
                        .map(|(decision, request)| match decision {
                            Decision::Accept { .. } => Err(Error::Fenced {
                                fence: fence.clone(),
                                current,
                                not_written: request.event_ids(),
                            }),
                            other => other.into_result(),
                        })
                        .collect();
                }
            }
            // The head moved (another server committed), or something unexplained happened:
            // either way the claim cache is suspect and the index may be behind.
            self.stale = true;
            guard_failures += 1;
            if guard_failures > GUARD_RETRIES_MAX || Instant::now() >= deadline {
                return group
                    .iter()
                    .map(|_| {
                        Err(Error::Unavailable {
                            reason: format!(
                                "etcd: the log's head kept moving under this committer \
                                 ({guard_failures} attempts): other servers are committing"
                            ),
                        })
                    })
                    .collect();
            }
        }
    }

    /// Makes the index and the claim cache valid at the head, with every claim of `group` in
    /// the cache: reads the head and the missing claims in one transaction; if the head moved,
    /// drops the cache and catches the index up to the new head.
    async fn load(&mut self, group: &[&AppendRequest], deadline: Instant) -> Result<(), Failure> {
        for _ in 0..8 {
            if self.stale {
                self.claims.clear();
            }
            let mut claims: Vec<&str> = Vec::new();
            for request in group {
                for claim in &request.claims {
                    if !self.claims.contains_key(claim.key()) && !claims.contains(&claim.key()) {
                        claims.push(claim.key());
                    }
                }
            }
            let indexed = self.index.lock().await.head();
            if !self.stale && indexed == self.head && claims.is_empty() {
                return Ok(());
            }
            let mut ops = vec![TxnOp::get(self.keys.head(), None)];
            ops.extend(claims.iter().map(|k| TxnOp::get(self.keys.claim(k), None)));
            let response = self
                .etcd
                .txn(
                    "reading the head and claims",
                    deadline,
                    Txn::new().and_then(ops),
                )
                .await?;
            let values = gets(&response);
            let damaged = |reason: String| Failure::Refused {
                context: "reading the head and claims",
                reason,
            };
            let head = match values.first().cloned().flatten() {
                Some(kv) => Head::decode(kv.value()).map_err(|e| damaged(e.to_string()))?,
                None => Head::EMPTY,
            };
            let moved = self.stale || head != self.head;
            if moved {
                self.claims.clear();
                self.head = head;
                self.stale = false;
                self.reset_own_heads(head);
                // Another server's commits are durable too: waiters may see them now.
                self.shared.publish(head.position);
            }
            for (key, value) in claims.iter().zip(values.into_iter().skip(1)) {
                let holder = match value {
                    Some(kv) => Some(
                        String::from_utf8(kv.value().to_vec())
                            .map_err(|_| damaged(format!("claim {key} holds non-UTF-8 bytes")))?,
                    ),
                    None => None,
                };
                self.claims.insert((*key).to_owned(), holder);
            }
            let mut index = self.index.lock().await;
            if index.head().position > head.position {
                // A reader saw a later head (another server committed since): read again.
                self.stale = true;
                continue;
            }
            index
                .catch_up(&self.etcd, &self.keys, head, self.options.unavailable_after)
                .await
                .map_err(|err| match err {
                    Error::Unavailable { reason } => Failure::Unavailable(reason),
                    Error::StorageFull { reason } => Failure::Full(reason),
                    Error::Misconfigured { reason } => Failure::Misconfigured(reason),
                    other => Failure::Refused {
                        context: "indexing the log",
                        reason: other.to_string(),
                    },
                })?;
            if !moved {
                return Ok(());
            }
            // The head moved: the claims cached before were dropped; read what is missing.
        }
        Err(Failure::Unavailable(
            "etcd: the log's head kept moving while reading it: other servers are committing"
                .into(),
        ))
    }

    /// How `request` fares against the index, the claim cache and the effects of the groups in
    /// flight and of the requests before it in its group: this backend's lookups, decided by
    /// [`decide_append`] like on every backend.
    fn decide(&self, index: &LogIndex, overlay: &Overlay, request: &AppendRequest) -> Decision {
        let locations: Vec<Option<IdLocation>> = request
            .events
            .iter()
            .map(|e| {
                overlay
                    .ids
                    .get(&e.id)
                    .or_else(|| self.speculative.ids.get(&e.id))
                    .cloned()
                    .or_else(|| index.id(&e.id))
            })
            .collect();
        let stream_revision = || match overlay
            .heads
            .get(&request.stream)
            .or_else(|| self.speculative.heads.get(&request.stream))
        {
            Some(revision) => Some(*revision),
            None => index.stream_revision(&request.stream),
        };
        // `load` put every claim of the group in the cache; deciding without one would guess,
        // so a missing one fails the request instead.
        let holder = |key: &str| match overlay
            .claims
            .get(key)
            .or_else(|| self.speculative.claims.get(key))
            .or_else(|| self.claims.get(key))
        {
            Some(change) => Ok(change.clone()),
            None => Err(Error::Storage {
                context: "deciding an append",
                reason: format!("the holder of claim {key} was not loaded from etcd"),
            }),
        };
        decide_append(
            request,
            &locations,
            stream_revision,
            &holder,
            overlay.next_position,
        )
    }

    /// The group's transaction.
    fn plan(
        &self,
        group: &[&AppendRequest],
        decisions: &[Decision],
        overlay: &Overlay,
        fence: Option<&Fence>,
    ) -> Plan {
        let keys = &self.keys;
        let recorded_at = Timestamp::now().0.max(self.head.recorded_at);
        let mut compares = vec![if self.head.position == 0 {
            Compare::version(keys.head(), CompareOp::Equal, 0)
        } else {
            Compare::value(keys.head(), CompareOp::Equal, self.head.encode())
        }];
        let first_position = self.head.position + 1;
        let last_position = overlay.next_position - 1;
        let mut success = Vec::new();
        let mut failure = vec![
            TxnOp::get(keys.head(), None),
            TxnOp::get(keys.log(last_position), None),
        ];
        let mut batch = codec::BatchWriter::new();
        let mut prev_hash = self.head.hash;
        for (request, decision) in group.iter().zip(decisions) {
            let Decision::Accept {
                first_revision,
                first_position: request_first,
                ..
            } = decision
            else {
                continue;
            };
            for (offset, proposed) in request.events.iter().enumerate() {
                let position = request_first + offset as u64;
                let revision = first_revision + offset as u64;
                let mut event = RecordedEventRef {
                    position: Position(position),
                    stream: &request.stream,
                    revision,
                    id: proposed.id,
                    recorded_at: Timestamp(recorded_at),
                    actor: &proposed.actor,
                    correlation_id: proposed.correlation_id,
                    causation_id: proposed.causation_id,
                    event_type: &proposed.event_type,
                    schema_version: proposed.schema_version,
                    payload: &proposed.payload,
                    prev_hash: &prev_hash,
                    hash: &[0; 32],
                };
                let hash = event_hash(&event);
                event.hash = &hash;
                batch.push(&event);
                prev_hash = hash;
            }
        }
        for (key, owner) in &overlay.claims {
            success.push(match owner {
                Some(owner) => TxnOp::put(keys.claim(key), owner.clone(), None),
                None => TxnOp::delete(keys.claim(key), None),
            });
        }
        success.push(TxnOp::put(keys.log(last_position), batch.finish(), None));
        let head = Head {
            position: last_position,
            hash: prev_hash,
            recorded_at,
        };
        success.push(TxnOp::put(
            keys.time(Timestamp(recorded_at), first_position),
            Vec::new(),
            None,
        ));
        success.push(TxnOp::put(keys.head(), head.encode(), None));
        if let Some(fence) = fence {
            // The leadership key still has the create revision of the fence's term: a deposed
            // leader's key is gone (its lease expired) or re-created by the next term.
            compares.push(Compare::create_revision(
                keys.fence(&fence.name),
                CompareOp::Equal,
                i64::try_from(fence.token).unwrap_or(i64::MAX),
            ));
            failure.push(TxnOp::get(keys.fence(&fence.name), None));
        }
        Plan {
            txn: Txn::new().when(compares).and_then(success).or_else(failure),
            head,
        }
    }

    /// The group is committed: the index takes it and the head is published.
    async fn apply(
        &mut self,
        group: &[&AppendRequest],
        decisions: &[Decision],
        head: Head,
        events: u64,
    ) {
        self.index_committed(group, decisions, head).await;
        self.head = head;
        self.own_head(head);
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
        self.shared
            .committed_events
            .fetch_add(events, Ordering::Relaxed);
        self.shared.publish(head.position);
    }

    /// Takes a committed group that ends at `head` into the claim cache, and into the index
    /// unless a reader has read it there already. If the index is short of the group's first
    /// position (cannot happen while groups are answered in order), the committer goes stale
    /// and the next load reads it.
    async fn index_committed(
        &mut self,
        group: &[&AppendRequest],
        decisions: &[Decision],
        head: Head,
    ) {
        for decision in decisions {
            if let Decision::Accept { claims, .. } = decision {
                for (key, owner) in claims {
                    self.claims.insert(key.clone(), owner.clone());
                }
            }
        }
        let mut index = self.index.lock().await;
        if index.head().position >= head.position {
            return;
        }
        let taken = (|| {
            for (request, decision) in group.iter().zip(decisions) {
                if let Decision::Accept {
                    first_revision,
                    first_position,
                    ..
                } = decision
                {
                    index.append(
                        &request.stream,
                        *first_revision,
                        *first_position,
                        request.events.iter().map(|e| e.id),
                    )?;
                }
            }
            index.advance(head)
        })();
        if let Err(err) = taken {
            tracing::warn!(%err, "the etcd log's index did not take a committed group; re-reading");
            *index = LogIndex::new();
            self.stale = true;
        }
    }
}

/// A group whose transaction is in flight.
struct InFlight {
    group: Vec<Pending>,
    fence: Option<Fence>,
    deadline: Instant,
    decisions: Vec<Decision>,
    /// The head it was decided on (its compare).
    base: Head,
    /// Its transaction, to send again unchanged when it was overtaken.
    txn: Txn,
    resent: u32,
    /// The head once it commits.
    head: Head,
    events: u64,
    sent: Instant,
    response: tokio::task::JoinHandle<Result<TxnResponse, Failure>>,
}

impl InFlight {
    async fn wait(&mut self) -> Result<TxnResponse, Failure> {
        match (&mut self.response).await {
            Ok(response) => response,
            Err(err) => Err(Failure::Unavailable(format!(
                "etcd: the task committing appends failed: {err}"
            ))),
        }
    }
}

/// Sends a commit transaction in a task of its own (so several can be in flight).
fn send(
    etcd: &Etcd,
    deadline: Instant,
    txn: Txn,
) -> tokio::task::JoinHandle<Result<TxnResponse, Failure>> {
    let etcd = etcd.clone();
    tokio::spawn(async move { etcd.txn("committing appends", deadline, txn).await })
}

fn reply(group: Vec<Pending>, results: Vec<Result<AppendResult>>) {
    for (pending, result) in group.into_iter().zip(results) {
        // The appender may have given up (its thread panicked); nothing to do then.
        let _ = pending.reply.send(result);
    }
}

/// The answers to a group whose transaction's outcome is unknown (or refused).
fn unknown_outcome(decisions: Vec<Decision>, failure: &Failure) -> Vec<Result<AppendResult>> {
    let reason = match failure {
        Failure::Unavailable(reason) => format!(
            "{reason}; the append may or may not be committed: retry it with the same event ids"
        ),
        // Refused before anything was committed: said as it is, nothing to wonder about.
        Failure::Full(reason) | Failure::Misconfigured(reason) => reason.clone(),
        Failure::Refused { reason, .. } => reason.clone(),
    };
    decisions
        .into_iter()
        .map(|decision| match decision {
            Decision::Reject(err) => Err(err),
            Decision::Replay(result) => Ok(result),
            Decision::Accept { .. } => Err(match failure {
                Failure::Unavailable(_) => Error::Unavailable {
                    reason: reason.clone(),
                },
                Failure::Full(_) => Error::StorageFull {
                    reason: reason.clone(),
                },
                Failure::Misconfigured(_) => Error::Misconfigured {
                    reason: reason.clone(),
                },
                Failure::Refused { context, .. } => Error::Storage {
                    context,
                    reason: reason.clone(),
                },
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EtcdLog;
    use uuid::Uuid;
    use vmplane_store::{ExpectedRevision, ProposedEvent};

    fn one_event_append(stream: &str) -> AppendRequest {
        AppendRequest::new(
            stream,
            ExpectedRevision::Any,
            vec![ProposedEvent {
                id: Uuid::now_v7(),
                event_type: "T".into(),
                schema_version: 1,
                payload: vec![0; 256],
                actor: "a".into(),
                correlation_id: Uuid::now_v7(),
                causation_id: None,
            }],
        )
    }

    /// How many one-event appends on distinct streams (each with `claims` claims) one group
    /// takes under `ops_max`.
    fn group_size(ops_max: usize, claims: usize) -> usize {
        let mut budget = Budget::default();
        let mut taken = 0;
        loop {
            let mut append = one_event_append(&format!("s{taken}"));
            append.claims = (0..claims)
                .map(|c| vmplane_store::Claim::Acquire {
                    key: format!("k{taken}/{c}"),
                    owner: "o".into(),
                })
                .collect();
            let cost = Budget::cost(&append);
            if taken > 0 && !budget.fits(&cost, ops_max) {
                return taken;
            }
            budget.add(cost);
            taken += 1;
        }
    }

    #[test]
    fn a_group_uses_operations_only_for_claims_and_respects_the_configured_limit() {
        // Events and their ids share the batch's one put: a group of plain appends is bounded
        // by bytes, not by etcd's operation limit.
        let plain = group_size(128, 0);
        assert!(plain > 1_000, "{plain} plain appends per group");
        assert!(
            plain <= GROUP_BYTES_MAX / 656,
            "{plain} plain appends per group"
        );
        assert_eq!(plain, group_size(1024, 0));
        // Per claim: one put (and one read when not cached); per group: batch, time index, head.
        assert_eq!(group_size(128, 1), 125);
        assert_eq!(group_size(1024, 1), 1021);
        let largest = AppendRequest::new(
            "s",
            ExpectedRevision::Any,
            (0..EtcdLog::LIMITS.append_batch_events_max)
                .map(|_| one_event_append("s").events.remove(0))
                .collect(),
        );
        let cost = Budget::cost(&largest);
        assert!(
            Budget::default().fits(&cost, 128),
            "the largest append fits alone"
        );
    }
}

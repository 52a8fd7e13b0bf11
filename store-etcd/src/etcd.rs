//! The thin etcd client made fault tolerant, because `etcd-client` is not: every call has a
//! per-request deadline, is retried on transport errors, on "no leader" and on timeouts until an
//! overall deadline, and then fails as [`Error::Unavailable`] naming etcd and the last cause.
//! Requests carry `require_leader`, so a member cut off from the quorum answers at once instead of
//! hanging. A retried write is safe because every write is a compare-and-swap on the head.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, GetResponse, KeyValue, KvClient, Txn};
use etcd_client::{TxnOp, TxnOpResponse, TxnResponse};
use tonic::Code;
use vmplane_store::Error;

/// Responses hold at most `read_page_events_max` events of at most 1 MiB each.
const DECODING_MESSAGE_BYTES_MAX: usize = 320 << 20;

/// What etcd says when a transaction holds more operations than its `--max-txn-ops`.
const TOO_MANY_OPS: &str = "too many operations in txn request";

/// Distinct failure causes an `Unavailable` error quotes.
const CAUSES_SHOWN_MAX: usize = 3;

/// A connection to one etcd cluster.
#[derive(Clone)]
pub(crate) struct Etcd {
    client: Client,
    kv: KvClient,
    endpoints: String,
    endpoint_list: Vec<String>,
    request_timeout: Duration,
    /// For the committer: a connection to the leader's endpoint alone, tried first.
    pin: Option<Arc<Pin>>,
    /// Whether etcd answers, shared by every clone (said to operators and in metrics).
    reachability: Arc<Reachability>,
}

/// How often a WARN says again that etcd is still unreachable.
const UNREACHABLE_WARN_EVERY: Duration = Duration::from_secs(30);

/// Whether the cluster answered lately: down once one operation has failed to get an answer
/// for longer than a request's timeout (a single refused connection to a dead member, retried
/// on another at once, is not an outage), up again at the next answer. Each change is logged
/// once (WARN when it goes, INFO when it is back), and an outage again every
/// [`UNREACHABLE_WARN_EVERY`].
#[derive(Debug)]
pub(crate) struct Reachability {
    up: AtomicBool,
    /// When it went down, and when a WARN last said so.
    down: Mutex<Option<(Instant, Instant)>>,
}

impl Default for Reachability {
    fn default() -> Self {
        Reachability {
            up: AtomicBool::new(true),
            down: Mutex::new(None),
        }
    }
}

impl Reachability {
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    fn failing(&self, endpoints: &str, what: &str, cause: &str) {
        let now = Instant::now();
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *down {
            None => {
                *down = Some((now, now));
                self.up.store(false, Ordering::Relaxed);
                tracing::warn!(
                    etcd = endpoints,
                    while_ = what,
                    %cause,
                    "etcd unreachable: the log cannot be read or written until it answers"
                );
            }
            Some((since, warned)) if now.duration_since(*warned) >= UNREACHABLE_WARN_EVERY => {
                *warned = now;
                tracing::warn!(
                    etcd = endpoints,
                    while_ = what,
                    %cause,
                    down_secs = now.duration_since(*since).as_secs(),
                    "etcd still unreachable"
                );
            }
            Some(_) => {}
        }
    }

    fn answered(&self, endpoints: &str) {
        if self.is_up() {
            return;
        }
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((since, _)) = down.take() {
            self.up.store(true, Ordering::Relaxed);
            tracing::info!(
                etcd = endpoints,
                down_ms = since.elapsed().as_millis() as u64,
                "etcd reachable again"
            );
        }
    }
}

/// A connection to one member (the leader when it was made), used for the first attempt of
/// every call; retries go through the balanced connection to every member.
///
/// Why: the balanced connection spreads requests over the members, and followers forward
/// proposals to the leader on separate paths, so two transactions sent one after the other may
/// be applied in the other order; a pipelined commit that overtakes the one before it fails its
/// head compare. Through one connection to the leader they arrive in order, and no member
/// spends CPU forwarding.
#[derive(Default)]
struct Pin {
    kv: Mutex<Option<KvClient>>,
    /// A call through the pinned connection failed: find the leader again.
    failed: AtomicBool,
    /// A search for the leader is running.
    searching: AtomicBool,
}

/// Why a call failed, before it becomes a store [`Error`]: cloneable, so one failure can answer
/// every append of a group.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// The cluster did not answer usefully before the deadline.
    Unavailable(String),
    /// etcd is out of space (NOSPACE): refused before anything was committed.
    Full(String),
    /// etcd refused the request because of how this log is configured (a transaction with more
    /// operations than `--max-txn-ops`): refused before anything was committed.
    Misconfigured(String),
    /// etcd refused the request for a reason a retry will not change.
    Refused {
        context: &'static str,
        reason: String,
    },
}

impl Failure {
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::Unavailable(reason) => Error::Unavailable { reason },
            Failure::Full(reason) => Error::StorageFull { reason },
            Failure::Misconfigured(reason) => Error::Misconfigured { reason },
            Failure::Refused { context, reason } => Error::Storage { context, reason },
        }
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Error {
        failure.into_error()
    }
}

enum Verdict {
    Retry(String),
    Refuse(String),
    Full(String),
}

fn judge(err: &etcd_client::Error) -> Verdict {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message().to_owned();
            match status.code() {
                Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::NotFound
                | Code::AlreadyExists
                | Code::Unimplemented
                | Code::OutOfRange => Verdict::Refuse(format!("{:?}: {message}", status.code())),
                Code::ResourceExhausted => Verdict::Full(message),
                code => Verdict::Retry(format!("{code:?}: {message}")),
            }
        }
        other => Verdict::Retry(other.to_string()),
    }
}

impl Etcd {
    /// Connects lazily: nothing is contacted until the first call.
    pub(crate) async fn connect(
        endpoints: &[String],
        request_timeout: Duration,
    ) -> Result<Etcd, Failure> {
        let options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(request_timeout.min(Duration::from_secs(1)));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|err| Failure::Refused {
                context: "connecting to etcd",
                reason: format!("{}: {err}", endpoints.join(",")),
            })?;
        let kv = client
            .kv_client()
            .max_decoding_message_size(DECODING_MESSAGE_BYTES_MAX);
        Ok(Etcd {
            client,
            kv,
            endpoints: endpoints.join(","),
            endpoint_list: endpoints.to_vec(),
            request_timeout,
            pin: None,
            reachability: Arc::new(Reachability::default()),
        })
    }

    /// This connection, trying the leader's endpoint first once [`Etcd::repin`] found it.
    pub(crate) fn pinned(&self) -> Etcd {
        Etcd {
            pin: Some(Arc::new(Pin::default())),
            ..self.clone()
        }
    }

    /// Whether the pinned connection should be looked for again (a call through it failed, or
    /// none was found yet); claims the search when it returns true.
    pub(crate) fn should_repin(&self, also: bool) -> bool {
        let Some(pin) = &self.pin else {
            return false;
        };
        let wanted = also
            || pin.failed.load(Ordering::Relaxed)
            || pin.kv.lock().map(|kv| kv.is_none()).unwrap_or(true);
        wanted
            && pin
                .searching
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Finds the leader's endpoint (each member is asked for its status) and pins the first
    /// attempt of every call to it; without a leader, calls use the balanced connection.
    pub(crate) async fn repin(&self) {
        let Some(pin) = &self.pin else {
            return;
        };
        let leader = self.find_leader().await;
        if let Ok(mut kv) = pin.kv.lock() {
            *kv = leader;
        }
        pin.failed.store(false, Ordering::Relaxed);
        pin.searching.store(false, Ordering::Release);
    }

    async fn find_leader(&self) -> Option<KvClient> {
        let options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(self.request_timeout.min(Duration::from_secs(1)))
            .with_timeout(self.request_timeout);
        for endpoint in &self.endpoint_list {
            let attempt = tokio::time::timeout(self.request_timeout, async {
                let mut client = Client::connect([endpoint], Some(options.clone())).await?;
                let status = client.status().await?;
                Ok::<_, etcd_client::Error>((client, status))
            })
            .await;
            let Ok(Ok((client, status))) = attempt else {
                continue;
            };
            let member = status.header().map(|h| h.member_id());
            if status.leader() != 0 && member == Some(status.leader()) {
                tracing::debug!(%endpoint, "etcd: commits go to the leader's endpoint first");
                return Some(
                    client
                        .kv_client()
                        .max_decoding_message_size(DECODING_MESSAGE_BYTES_MAX),
                );
            }
        }
        None
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// Whether etcd answered lately (see [`Reachability`]).
    pub(crate) fn reachable(&self) -> bool {
        self.reachability.is_up()
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Runs `call` until it succeeds, is refused, or `deadline` passes.
    pub(crate) async fn retry<T, F, Fut>(
        &self,
        what: &'static str,
        deadline: Instant,
        mut call: F,
    ) -> Result<T, Failure>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        // The distinct causes seen, most recent last (a dead member's "connection refused"
        // alone would hide the survivor's "no leader").
        let mut causes: Vec<String> = Vec::new();
        let mut attempt = 0u32;
        loop {
            let now = Instant::now();
            if now >= deadline {
                let causes = if causes.is_empty() {
                    "no attempt was made".to_owned()
                } else {
                    causes.join("; ")
                };
                return Err(Failure::Unavailable(format!(
                    "etcd cluster [{}] unavailable while {what} (gave up after {} ms, {attempt} \
                     attempts): {causes}",
                    self.endpoints,
                    started.elapsed().as_millis()
                )));
            }
            let budget = self.request_timeout.min(deadline - now);
            let pinned = match &self.pin {
                Some(pin) if attempt == 0 => pin.kv.lock().ok().and_then(|kv| kv.clone()),
                _ => None,
            };
            let through_pin = pinned.is_some();
            let kv = pinned.unwrap_or_else(|| self.kv.clone());
            let outcome = tokio::time::timeout(budget, call(kv)).await;
            if through_pin
                && !matches!(outcome, Ok(Ok(_)))
                && let Some(pin) = &self.pin
            {
                pin.failed.store(true, Ordering::Relaxed);
            }
            let last = match outcome {
                Ok(Ok(value)) => {
                    self.reachability.answered(&self.endpoints);
                    return Ok(value);
                }
                Ok(Err(err)) => match judge(&err) {
                    Verdict::Retry(reason) => reason,
                    Verdict::Refuse(reason) if reason.contains(TOO_MANY_OPS) => {
                        return Err(Failure::Misconfigured(format!(
                            "etcd refused a transaction while {what} ({reason}): the log's \
                             operations per transaction (vmplane serve --etcd-max-txn-ops, \
                             EtcdOptions::txn_ops_max) exceed an etcd member's --max-txn-ops; \
                             lower the one or raise the other"
                        )));
                    }
                    Verdict::Refuse(reason) => {
                        return Err(Failure::Refused {
                            context: what,
                            reason: format!("etcd refused the request: {reason}"),
                        });
                    }
                    Verdict::Full(reason) => {
                        return Err(Failure::Full(format!(
                            "etcd cluster [{}] is out of space while {what} ({reason}): \
                             compact, defragment and disarm the NOSPACE alarm",
                            self.endpoints
                        )));
                    }
                },
                Err(_) => format!("no answer within {} ms", budget.as_millis()),
            };
            if started.elapsed() >= self.request_timeout {
                self.reachability.failing(&self.endpoints, what, &last);
            }
            causes.retain(|cause| *cause != last);
            causes.push(last);
            if causes.len() > CAUSES_SHOWN_MAX {
                causes.remove(0);
            }
            attempt += 1;
            // Connection refused comes back at once: retry soon, but do not spin.
            let pause = Duration::from_millis((5u64 << attempt.min(6)).min(200));
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(pause.min(left)).await;
        }
    }

    /// One key, or `None`.
    pub(crate) async fn get(
        &self,
        what: &'static str,
        deadline: Instant,
        key: Vec<u8>,
    ) -> Result<Option<KeyValue>, Failure> {
        let mut response = self
            .retry(what, deadline, |mut kv| {
                let key = key.clone();
                async move { kv.get(key, None).await }
            })
            .await?;
        Ok(response.take_kvs().into_iter().next())
    }

    /// Keys in `[from, end)`, at most `limit` (0 = no limit), in key order.
    pub(crate) async fn range(
        &self,
        what: &'static str,
        deadline: Instant,
        from: Vec<u8>,
        end: Vec<u8>,
        options: GetOptions,
    ) -> Result<GetResponse, Failure> {
        self.retry(what, deadline, |mut kv| {
            let from = from.clone();
            let options = options.clone().with_range(end.clone());
            async move { kv.get(from, Some(options)).await }
        })
        .await
    }

    /// Runs `txn`, retrying the identical request (safe: every write compares the head).
    pub(crate) async fn txn(
        &self,
        what: &'static str,
        deadline: Instant,
        txn: Txn,
    ) -> Result<TxnResponse, Failure> {
        self.retry(what, deadline, |mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Reads `keys` (each a point get or, with an end, a range) in one round trip per 128 keys;
    /// returns each one's key-values in order.
    pub(crate) async fn read_many(
        &self,
        what: &'static str,
        deadline: Instant,
        reads: Vec<(Vec<u8>, Option<GetOptions>)>,
    ) -> Result<Vec<Vec<KeyValue>>, Failure> {
        let mut out = Vec::with_capacity(reads.len());
        for chunk in reads.chunks(TXN_OPS_MAX) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(key, options)| TxnOp::get(key.clone(), options.clone()))
                .collect();
            let response = self.txn(what, deadline, Txn::new().and_then(ops)).await?;
            let responses = response.op_responses();
            if responses.len() != chunk.len() {
                return Err(Failure::Refused {
                    context: what,
                    reason: format!("etcd answered {} of {} reads", responses.len(), chunk.len()),
                });
            }
            for op in responses {
                match op {
                    TxnOpResponse::Get(mut get) => out.push(get.take_kvs()),
                    _ => {
                        return Err(Failure::Refused {
                            context: what,
                            reason: "etcd answered a read with a write".into(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

/// etcd's default `--max-txn-ops`: each of a transaction's compare, success and failure lists
/// holds at most this many entries.
pub(crate) const TXN_OPS_MAX: usize = 128;

/// The values of a transaction's get responses (failure branch or read-only transaction).
pub(crate) fn gets(response: &TxnResponse) -> Vec<Option<KeyValue>> {
    response
        .op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        })
        .collect()
}

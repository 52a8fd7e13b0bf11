//! Leader election through an etcd lease, and the fence a leader's appends carry.
//!
//! A term of leadership `name` is the key `<namespace>/v1/leader/<name>`, created with
//! `create_revision == 0` in one transaction and attached to a lease of `ttl`; the key's create
//! revision is the term's fence token ([`vmplane_store::Fence`]). The holder keeps the lease
//! alive (every third of its TTL); when it stops (a crash, a pause, a partition) etcd deletes
//! the key as the lease expires, and a candidate polling the key takes the next term — with a
//! new create revision, so the old term's fence never matches again. Every append the leader
//! makes with [`vmplane_store::EventLog::append_fenced`] compares that create revision in the
//! same transaction as its writes (see the `commit` module), which is what makes the lease safe:
//! a leader that does not know it was deposed still cannot write.
//!
//! The leader also knows, locally, when its term may have ended: the lease was last renewed no
//! earlier than when the keep-alive was *sent*, so it cannot outlive `sent + ttl`. [`Term::lost`]
//! reports the term over from that moment on (a process resumed after `SIGSTOP` sees it at once),
//! as soon as etcd answers a keep-alive with TTL 0, and when the key is gone or re-created.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use vmplane_store::{Error, Fence, Result};

use crate::etcd::Etcd;
use crate::keys::Keys;

/// Bytes in a leadership name.
pub const ELECTION_NAME_BYTES_MAX: usize = 128;

/// A leadership that processes on one log campaign for ([`crate::EtcdLog::election`]).
pub struct Election {
    handle: Handle,
    etcd: Etcd,
    key: Vec<u8>,
    name: String,
    holder: String,
    ttl: Duration,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// What a term's watcher shares with its [`Term`].
struct TermShared {
    /// `Some(reason)` once the term is over.
    lost: Mutex<Option<String>>,
    changed: Condvar,
    /// The latest moment the lease can still be alive, as far as this process knows.
    deadline: Mutex<Instant>,
}

impl TermShared {
    fn lose(&self, reason: String) {
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        if lost.is_none() {
            tracing::warn!(%reason, "leadership lost");
            *lost = Some(reason);
        }
        self.changed.notify_all();
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_lost(&self) -> Option<String> {
        if let Some(reason) = self
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Some(reason);
        }
        (Instant::now() >= self.deadline())
            .then(|| "the lease was not renewed within its TTL".to_owned())
    }
}

/// One term of leadership held by this process. Dropping it stops renewing the lease (the term
/// ends when the lease expires); [`Term::resign`] ends it at once.
pub struct Term {
    fence: Fence,
    lease: i64,
    ttl: Duration,
    etcd: Etcd,
    handle: Handle,
    shared: Arc<TermShared>,
    watcher: JoinHandle<()>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("fence", &self.fence)
            .field("lease", &self.lease)
            .field("lost", &self.lost())
            .finish_non_exhaustive()
    }
}

impl Election {
    pub(crate) fn new(
        handle: Handle,
        etcd: Etcd,
        keys: &Keys,
        name: &str,
        holder: String,
        ttl: Duration,
    ) -> Result<Election> {
        if name.is_empty() || name.contains('/') || name.len() > ELECTION_NAME_BYTES_MAX {
            return Err(Error::InvalidRequest {
                reason: format!(
                    "leadership name {name:?}: 1 to {ELECTION_NAME_BYTES_MAX} bytes, no '/'"
                ),
            });
        }
        if ttl < Duration::from_secs(1) {
            return Err(Error::InvalidRequest {
                reason: format!("a leader lease of {ttl:?}: at least 1 s"),
            });
        }
        Ok(Election {
            handle,
            etcd,
            key: keys.fence(name),
            name: name.to_owned(),
            holder,
            ttl,
        })
    }

    /// The leadership's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How often a candidate looks whether the leadership is free, and a leader checks its key.
    fn poll(&self) -> Duration {
        (self.ttl / 8).clamp(Duration::from_millis(100), Duration::from_millis(500))
    }

    /// Blocks until this process holds the leadership (a new [`Term`]) or `give_up` returns
    /// true (checked at every poll, a few times a second). etcd being unreachable is waited out,
    /// not an error. Must not be called from inside an async runtime.
    pub fn campaign(&self, give_up: &dyn Fn() -> bool) -> Result<Option<Term>> {
        self.handle.block_on(async {
            loop {
                if give_up() {
                    return Ok(None);
                }
                match self.try_take().await {
                    Ok(Some(term)) => return Ok(Some(term)),
                    Ok(None) => {}
                    Err(err) => {
                        tracing::debug!(%err, leadership = %self.name, "campaign attempt failed")
                    }
                }
                tokio::time::sleep(self.poll()).await;
            }
        })
    }

    /// One attempt: if nobody holds the key, grant a lease and create the key with it.
    async fn try_take(&self) -> Result<Option<Term>> {
        let deadline = Instant::now() + self.etcd.request_timeout();
        if self
            .etcd
            .get("reading the leader key", deadline, self.key.clone())
            .await?
            .is_some()
        {
            return Ok(None);
        }
        let mut leases = self.etcd.client().lease_client();
        let asked = Instant::now();
        let ttl_secs = i64::try_from(self.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let granted =
            tokio::time::timeout(self.etcd.request_timeout(), leases.grant(ttl_secs, None))
                .await
                .map_err(|_| Error::Unavailable {
                    reason: "etcd: no answer to a lease grant".into(),
                })?
                .map_err(|err| Error::Unavailable {
                    reason: format!("etcd: granting a lease: {err}"),
                })?;
        let lease = granted.id();
        // etcd may raise a short TTL to its minimum: the granted one is what counts.
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                self.holder.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let response = match self
            .etcd
            .txn("creating the leader key", deadline, txn)
            .await
        {
            Ok(response) => response,
            Err(failure) => {
                revoke(&self.etcd, lease).await;
                return Err(failure.into_error());
            }
        };
        let revision = response.header().map_or(0, |h| h.revision());
        if !response.succeeded() || revision <= 0 {
            // Someone else was faster (or an earlier identical attempt of ours committed and
            // its answer was lost: revoking deletes that key too, and the next poll retries).
            revoke(&self.etcd, lease).await;
            return Ok(None);
        }
        let fence = Fence {
            name: self.name.clone(),
            token: revision as u64,
        };
        let shared = Arc::new(TermShared {
            lost: Mutex::new(None),
            changed: Condvar::new(),
            deadline: Mutex::new(asked + ttl),
        });
        let watcher = self.handle.spawn(watch_term(
            self.etcd.clone(),
            self.key.clone(),
            fence.token,
            lease,
            ttl,
            self.poll(),
            Arc::clone(&shared),
        ));
        tracing::info!(leadership = %self.name, token = fence.token, lease, ttl_secs = ttl.as_secs(), "leadership acquired");
        Ok(Some(Term {
            fence,
            lease,
            ttl,
            etcd: self.etcd.clone(),
            handle: self.handle.clone(),
            shared,
            watcher,
        }))
    }
}

async fn revoke(etcd: &Etcd, lease: i64) {
    let mut leases = etcd.client().lease_client();
    let _ = tokio::time::timeout(etcd.request_timeout(), leases.revoke(lease)).await;
}

/// Renews the lease every third of its TTL and checks the key at every poll, until the term is
/// over.
async fn watch_term(
    etcd: Etcd,
    key: Vec<u8>,
    token: u64,
    lease: i64,
    ttl: Duration,
    poll: Duration,
    shared: Arc<TermShared>,
) {
    let renew_every = ttl / 3;
    let mut last_renewal = Instant::now();
    let mut keeper: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
    loop {
        tokio::time::sleep(poll).await;
        if Instant::now() >= shared.deadline() {
            shared.lose(format!(
                "the lease was not renewed within its {} s TTL",
                ttl.as_secs()
            ));
            return;
        }
        if last_renewal.elapsed() >= renew_every {
            let sent = Instant::now();
            let left = shared.deadline().saturating_duration_since(sent);
            let renewal = tokio::time::timeout(left.min(etcd.request_timeout()), async {
                if keeper.is_none() {
                    keeper = Some(etcd.client().lease_client().keep_alive(lease).await?);
                }
                let (k, stream) = keeper.as_mut().expect("set above");
                k.keep_alive().await?;
                stream.message().await
            })
            .await;
            match renewal {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                    let granted = Duration::from_secs(answer.ttl() as u64);
                    *shared
                        .deadline
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = sent + granted;
                    last_renewal = sent;
                }
                Ok(Ok(Some(_))) => {
                    shared.lose("etcd says the lease has expired".into());
                    return;
                }
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    // The stream broke or etcd did not answer: open a new stream next time.
                    keeper = None;
                }
            }
        }
        let deadline = Instant::now() + poll.max(Duration::from_millis(200));
        match etcd
            .get("checking the leader key", deadline, key.clone())
            .await
        {
            Ok(Some(kv)) if kv.create_revision() as u64 == token => {}
            Ok(Some(kv)) => {
                shared.lose(format!(
                    "the leadership is held by another term ({})",
                    kv.create_revision()
                ));
                return;
            }
            Ok(None) => {
                shared.lose("the leader key is gone (the lease expired)".into());
                return;
            }
            Err(_) => {}
        }
    }
}

impl Term {
    /// The fence every append of this term carries.
    #[must_use]
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The lease TTL etcd granted.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// `Some(reason)` once the term is over, or may be: the lease's TTL passed without a
    /// renewal, etcd said it expired, or the key is gone or belongs to another term.
    #[must_use]
    pub fn lost(&self) -> Option<String> {
        self.shared.is_lost()
    }

    /// [`Term::lost`] as a function that can be kept elsewhere (it makes no etcd call).
    pub fn lost_check(&self) -> impl Fn() -> Option<String> + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || shared.is_lost()
    }

    /// Waits until the term is over (returns why) or `timeout` passes (`None`).
    pub fn wait_lost(&self, timeout: Duration) -> Option<String> {
        let until = Instant::now() + timeout;
        let mut lost = self
            .shared
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(reason) = lost.clone() {
                return Some(reason);
            }
            let now = Instant::now();
            if now >= self.shared.deadline() {
                return Some("the lease was not renewed within its TTL".to_owned());
            }
            if now >= until {
                return None;
            }
            let wait = until
                .min(self.shared.deadline())
                .saturating_duration_since(now);
            lost = self
                .shared
                .changed
                .wait_timeout(lost, wait)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Ends the term now: revokes the lease, which deletes the key, so another candidate takes
    /// over at its next poll. Must not be called from inside an async runtime.
    pub fn resign(self) {
        self.watcher.abort();
        self.shared.lose("resigned".into());
        let etcd = self.etcd.clone();
        let lease = self.lease;
        self.handle.block_on(revoke(&etcd, lease));
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

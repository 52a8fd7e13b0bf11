//! Exactly one reconciler acts at a time: the one of the server that leads.
//!
//! Every server with a `--hypervisor` runs a [`ReconcilerSupervisor`] thread that campaigns for
//! leadership `reconciler`. On etcd that is an election through a lease
//! ([`vmplane_store_etcd::Election`], TTL `--leader-lease-seconds`): the leader runs the
//! reconciler, the others stand by and take over when the leader's lease expires (a crash, a
//! pause, a partition) or it resigns (a clean shutdown). On sled one process holds the data
//! directory, so it leads from the start and never stops leading.
//!
//! Each term's reconciler writes through a command path over a [`FencedLog`]: every append it
//! makes carries the term's fence and is checked against the leadership in the same etcd
//! transaction, so a leader that was deposed without knowing it (paused past its lease) cannot
//! write; its appends fail with `Fenced`. The control plane also refuses to hand out desired
//! state once the supervisor knows the term is over, and the supervisor stops the reconciler.
//!
//! Operators and tests follow the terms on stderr: `vmplane: reconciler: leading (term T)`,
//! `vmplane: reconciler: stopped: ...`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use vmplane_hypervisor::{Nodes, Reconciler, WakeHandle};
use vmplane_projections::Projections;
use vmplane_projections::command::{CommandHandler, CommandOptions};
use vmplane_store::{EventLog, Fence, FencedLog};
use vmplane_store_etcd::{Election, Term};

use crate::control::ServerControlPlane;

/// The name of the reconciler's leadership.
pub const RECONCILER_LEADERSHIP: &str = "reconciler";

/// How long a new leader waits for its projections to reach the log's head before reconciling.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the supervisor looks at its term and at the stop flag.
const SUPERVISE_POLL: Duration = Duration::from_millis(100);

/// Where the reconciler's leadership comes from, per backend.
pub enum Leadership {
    /// An embedded log (sled, file): this process is the only one, so it leads, taking each
    /// term's fence from the log.
    Local(Arc<dyn Fn(&str) -> Fence + Send + Sync>),
    /// The log on etcd: an election among the servers sharing it.
    Etcd(Box<Election>),
}

/// One term, whichever the backend.
enum HeldTerm {
    Local(Fence),
    Etcd(Box<Term>),
}

impl HeldTerm {
    fn fence(&self) -> &Fence {
        match self {
            HeldTerm::Local(fence) => fence,
            HeldTerm::Etcd(term) => term.fence(),
        }
    }

    fn wait_lost(&self, timeout: Duration) -> Option<String> {
        match self {
            HeldTerm::Local(_) => {
                std::thread::sleep(timeout);
                None
            }
            HeldTerm::Etcd(term) => term.wait_lost(timeout),
        }
    }

    fn end(self) {
        if let HeldTerm::Etcd(term) = self {
            term.resign();
        }
    }
}

impl Leadership {
    fn campaign(&self, give_up: &dyn Fn() -> bool) -> anyhow::Result<Option<HeldTerm>> {
        match self {
            Leadership::Local(take_fence) => {
                Ok(Some(HeldTerm::Local(take_fence(RECONCILER_LEADERSHIP))))
            }
            Leadership::Etcd(election) => Ok(election
                .campaign(give_up)
                .context("campaign for the reconciler's leadership")?
                .map(|term| HeldTerm::Etcd(Box::new(term)))),
        }
    }
}

/// What a supervisor needs to run a reconciler in each term.
pub struct SupervisorParts {
    /// The log (unfenced); each term wraps it in its fence.
    pub log: Arc<dyn EventLog>,
    /// The server's projections (desired state; their cache is shared with the command path).
    pub projections: Arc<Projections>,
    /// `--hypervisor` nodes as `NAME=URI`.
    pub nodes: Vec<String>,
    /// Wakes whichever reconciler runs (the API calls it after writes).
    pub wake: WakeHandle,
}

/// The thread that campaigns, runs the reconciler while leading, and stops it when the term ends.
pub struct ReconcilerSupervisor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ReconcilerSupervisor {
    /// Starts campaigning on a thread of its own.
    pub fn spawn(leadership: Leadership, parts: SupervisorParts) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vmplane-leader".into())
            .spawn(move || supervise(&leadership, &parts, &flag))
            .context("start the reconciler's supervisor thread")?;
        Ok(ReconcilerSupervisor {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the reconciler (after its pass in progress), resigns the leadership so another
    /// server takes over at once, and joins the thread. Blocks.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the reconciler's supervisor thread panicked");
        }
    }
}

impl Drop for ReconcilerSupervisor {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn supervise(leadership: &Leadership, parts: &SupervisorParts, stop: &Arc<AtomicBool>) {
    let stopping = || stop.load(Ordering::SeqCst);
    // An embedded log's only server leads at once: it has no one to stand by for.
    let elected = matches!(leadership, Leadership::Etcd(_));
    if elected {
        eprintln!("vmplane: reconciler: standing by (campaigning for leadership)");
    }
    while !stopping() {
        let term = match leadership.campaign(&stopping) {
            Ok(Some(term)) => term,
            Ok(None) => break,
            Err(err) => {
                tracing::warn!(error = %crate::report::one_line(&err), "campaign failed; trying again");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let token = term.fence().token;
        tracing::info!(token, "leading: starting the reconciler");
        eprintln!("vmplane: reconciler: leading (term {token})");
        let reason = match lead(&term, parts, stop) {
            Ok(reason) => reason,
            Err(err) => {
                let reason = crate::report::one_line(&err);
                tracing::error!(error = %reason, "could not run the reconciler in this term");
                // Step down so another server can try; wait before campaigning again.
                std::thread::sleep(Duration::from_secs(1));
                reason
            }
        };
        eprintln!("vmplane: reconciler: stopped (term {token}): {reason}");
        // Revoke this term's lease (harmless if it expired: it is this term's own lease), so a
        // standby takes over at once rather than after the TTL.
        term.end();
        if !stopping() && elected {
            eprintln!("vmplane: reconciler: standing by (campaigning for leadership)");
        }
    }
}

/// Runs the reconciler for one term; returns why the term ended.
fn lead(
    term: &HeldTerm,
    parts: &SupervisorParts,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<String> {
    // Decide on the log as it is now, not on what this server's projections last applied.
    let head = parts.log.head();
    parts
        .projections
        .wait_for(head, CATCH_UP_TIMEOUT)
        .context("catch the projections up before reconciling")?;
    let fenced: Arc<dyn EventLog> =
        Arc::new(FencedLog::new(Arc::clone(&parts.log), term.fence().clone()));
    let commands = Arc::new(CommandHandler::new(
        fenced,
        parts.projections.cache().clone(),
        CommandOptions::default(),
    ));
    // The term's own view (no etcd call), shared with the control plane; and the shutdown,
    // so that a pass in progress stops at its next call to the control plane instead of going
    // over every VM first (a stop waits for the pass in progress).
    let shutting_down = Arc::clone(stop);
    let term_check: Box<dyn Fn() -> Option<String> + Send + Sync> = match term {
        HeldTerm::Local(_) => Box::new(|| None),
        HeldTerm::Etcd(t) => Box::new(t.lost_check()),
    };
    let term_over: Arc<dyn Fn() -> Option<String> + Send + Sync> = Arc::new(move || {
        if shutting_down.load(Ordering::SeqCst) {
            return Some("the server is shutting down".to_owned());
        }
        term_check()
    });
    let control = Arc::new(
        ServerControlPlane::new(Arc::clone(&parts.projections), commands).with_term(term_over),
    );
    let nodes = Nodes::open(&parts.nodes)
        .with_context(|| format!("--hypervisor {}: cannot open", parts.nodes.join(" ")))?;
    for node in nodes.iter() {
        tracing::info!(node = %node.name, vcpus = node.capacity.vcpus, memory_bytes = node.capacity.memory_bytes, "hypervisor node");
    }
    let reconciler =
        Reconciler::spawn_woken_by(control, nodes, Default::default(), parts.wake.clone())
            .context("start the reconciler")?;
    let reason = loop {
        crate::metrics::set_hypervisor_nodes(reconciler.node_reachability());
        if let Some(reason) = term.wait_lost(SUPERVISE_POLL) {
            break format!("leadership lost: {reason}");
        }
        if stop.load(Ordering::SeqCst) {
            break "shutting down".to_owned();
        }
    };
    drop(reconciler);
    crate::metrics::set_hypervisor_nodes(Vec::new());
    Ok(reason)
}

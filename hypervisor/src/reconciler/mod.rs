//! The level-triggered reconciler: compares what the control plane wants (VM and VMI states)
//! with what libvirt has (vmplane's domains on every node), acts on the difference, and
//! records what it did and saw as commands to the control plane.
//!
//! # One pass ([`Reconciler::run_once`])
//!
//! A pass is a list of small named steps (module `steps`), each with one concern; every step
//! that acts reports an [`Action`] saying *why*:
//!
//! 1. `observe_nodes` — list vmplane's domains on every node (one libvirt call a node).
//! 2. `remove_unwanted_domains` — destroy and undefine this log's domains whose VMI nobody
//!    wants (after a restart, or a VMI removed while vmplane was down). Domains without
//!    vmplane's metadata are never listed, and other logs' vmplane domains are left alone (see
//!    "Whose domains" below), so neither is ever touched.
//! 3. For each VM, up to [`ReconcilerOptions::vm_steps_per_pass_max`] times, what
//!    `core`'s `desired_action` says: `launch_vmi`, `stop_vmi` (graceful shutdown, then
//!    `destroy_after_grace_period`), `remove_vmi`, or waiting out a crash-loop backoff; and
//!    when it says nothing, moving the current VMI along: `schedule_vmi` (or record it
//!    unschedulable), `start_domain` (define and start) and `observe_domain` (record Running,
//!    or Succeeded/Failed when the domain stopped behind vmplane's back).
//! 4. For each standalone VMI, the same run steps, and `stop_vmi` + `remove_vmi` once it is
//!    deleted.
//!
//! A second pass right after the first finds nothing to do: no event appended and no libvirt
//! call that changes anything ([`PassReport::changed_nothing`]).
//!
//! # Adoption
//!
//! A domain is matched to its VMI by the VMI uid in its metadata, never by name. After a
//! restart the reconciler finds the domains it created and continues from what the log says
//! (a Running VMI whose domain runs needs nothing), instead of defining them again.
//!
//! # Whose domains
//!
//! Several vmplane servers, each with a log of its own, may drive the same libvirt (a second
//! instance, a test server next to production). A vmplane domain is **this log's** only when
//! the VMI uid in its metadata is one the log recorded — a VM's run or a standalone VMI, still
//! there or long gone ([`crate::ControlPlane::recorded_vmis`]). VMI uids are random, so:
//!
//! - a fresh log owns no domain: it never stops, changes or removes another server's;
//! - a log restored from a backup (on a new machine too) holds the same events, so it owns the
//!   domains its VMIs run in and adopts them, and removes those of VMIs it no longer wants;
//! - domains written by every earlier vmplane carry the VMI uid, so they stay their log's.
//!
//! Any other vmplane domain is reported once, when first seen ([`PassReport::foreign_domains`],
//! logged at info), and never touched. No separate identity of the log is written into the
//! domain: anything that survives backup and restore (so that a restored log adopts its
//! domains) is shared by every copy of the log, as the VMI uids are, and adds nothing to them.
//!
//! # What it remembers
//!
//! The deadlines of graceful stops in flight, the other logs' domains already reported, and since
//! when each node has been unreachable. A restart forgets them: the next pass asks the guest to
//! shut down again and the grace period starts over, and an unreachable node's timeout starts
//! over.
//!
//! # Threads
//!
//! [`Reconciler::spawn`] runs passes on a std thread of its own (`vmplane-reconciler`), never
//! on an async runtime: libvirt calls block. It wakes on libvirt lifecycle events (one
//! forwarding thread per node), on [`WakeHandle::wake`] (the gateway calls it after a write),
//! when a timer it knows of is due (end of a grace period or a backoff), and every
//! [`ReconcilerOptions::resync_interval_ms`].

mod steps;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use uuid::Uuid;

use crate::control_plane::ControlPlane;
use crate::error::{HypervisorError, SpecError};
use crate::hypervisor::DomainStatus;
use crate::mapping::DomainDefaults;
use crate::nodes::Nodes;
use crate::spec::DomainSpec;

/// How a [`Reconciler`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcilerOptions {
    /// A full pass at least this often, even without any wake-up: libvirt events are hints and
    /// can be lost (a subscriber's buffer is bounded).
    pub resync_interval_ms: u64,
    /// How many steps one VM may take in one pass (stop → remove → launch → schedule → start
    /// → observe is six). Bounds the work a pass spends on one VM.
    pub vm_steps_per_pass_max: usize,
    /// The domain type and emulator every domain is defined with.
    pub domain_defaults: DomainDefaults,
    /// Threads one pass uses to work on VMs side by side (1: one at a time, in order). Their
    /// libvirt calls overlap, and so do their appends, which the log commits as a group.
    pub workers: usize,
    /// How long a node's listing may fail, pass after pass, before its VMIs stop claiming to
    /// run: a running VMI of a VM is then recorded `Unknown` with reason `NodeUnreachable`
    /// (its `Ready` condition False). New VMIs are never placed on a node whose listing failed
    /// in the pass, whatever this says. 40 s: Kubernetes' `node-monitor-grace-period`, after
    /// which a node that stopped reporting is `Ready=Unknown`.
    pub node_unreachable_timeout_ms: u64,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        ReconcilerOptions {
            resync_interval_ms: 10_000,
            vm_steps_per_pass_max: 8,
            domain_defaults: DomainDefaults::default(),
            workers: 8,
            node_unreachable_timeout_ms: 40_000,
        }
    }
}

/// Counts of libvirt calls the reconciler made, by kind (for benchmarks and for checking
/// that a pass changed nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// `list_owned` (one per node and pass).
    pub list: u64,
    /// `state`.
    pub state: u64,
    /// `define`.
    pub define: u64,
    /// `start`.
    pub start: u64,
    /// `shutdown`.
    pub shutdown: u64,
    /// `destroy`.
    pub destroy: u64,
    /// `undefine`.
    pub undefine: u64,
}

impl CallCounts {
    /// Calls that change a domain: define, start, shutdown, destroy, undefine.
    pub fn mutating(&self) -> u64 {
        self.define + self.start + self.shutdown + self.destroy + self.undefine
    }

    /// Every call.
    pub fn total(&self) -> u64 {
        self.mutating() + self.list + self.state
    }

    fn minus(&self, earlier: &CallCounts) -> CallCounts {
        CallCounts {
            list: self.list - earlier.list,
            state: self.state - earlier.state,
            define: self.define - earlier.define,
            start: self.start - earlier.start,
            shutdown: self.shutdown - earlier.shutdown,
            destroy: self.destroy - earlier.destroy,
            undefine: self.undefine - earlier.undefine,
        }
    }
}

/// Live counters behind [`CallCounts`], shared with the [`ReconcilerHandle`].
#[derive(Debug, Default)]
struct Calls {
    list: AtomicU64,
    state: AtomicU64,
    define: AtomicU64,
    start: AtomicU64,
    shutdown: AtomicU64,
    destroy: AtomicU64,
    undefine: AtomicU64,
}

impl Calls {
    fn snapshot(&self) -> CallCounts {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CallCounts {
            list: r(&self.list),
            state: r(&self.state),
            define: r(&self.define),
            start: r(&self.start),
            shutdown: r(&self.shutdown),
            destroy: r(&self.destroy),
            undefine: r(&self.undefine),
        }
    }
}

/// One thing a step did, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// What it was about: `vm/<ns>/<name>`, `vmi/<ns>/<name>` or `domain/<node>/<name>`.
    pub subject: String,
    /// The step's name (`launch_vmi`, `schedule_vmi`, `stop_vmi`, …).
    pub step: &'static str,
    /// Why it acted, in words.
    pub why: String,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.subject, self.step, self.why)
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct PassReport {
    /// Every action, in order.
    pub actions: Vec<Action>,
    /// Events the control plane appended for this pass.
    pub events_appended: usize,
    /// libvirt calls made during the pass.
    pub calls: CallCounts,
    /// Failures (a node that could not be listed, a command the control plane could not
    /// execute, a libvirt call that failed); the next pass tries again.
    pub errors: Vec<String>,
    /// The earliest time (ms since the epoch) a timer this pass saw falls due: the end of a
    /// grace period or of a crash-loop backoff.
    pub next_due_ms: Option<i64>,
    /// vmplane domains of another log that this pass found and the pass before did not: never
    /// touched, said once (logged at info) rather than every pass.
    pub foreign_domains: Vec<String>,
    /// Nodes whose listing failed in this pass (unreachable): nothing was placed on them.
    pub unreachable_nodes: Vec<String>,
}

impl PassReport {
    /// True when the pass appended no event and made no libvirt call that changes a domain.
    pub fn changed_nothing(&self) -> bool {
        self.events_appended == 0 && self.calls.mutating() == 0
    }

    /// The actions of step `step`.
    pub fn actions_of(&self, step: &str) -> Vec<&Action> {
        self.actions.iter().filter(|a| a.step == step).collect()
    }

    fn due(&mut self, at_ms: i64) {
        self.next_due_ms = Some(self.next_due_ms.map_or(at_ms, |t| t.min(at_ms)));
    }
}

/// A graceful stop in flight: when its grace period ends, and whether vmplane destroyed it.
#[derive(Clone, Copy, Debug)]
struct Stopping {
    deadline_ms: i64,
    destroyed: bool,
}

/// Where a vmplane domain was found.
#[derive(Clone, Debug)]
struct Located {
    node: String,
    uuid: Uuid,
    name: String,
    status: DomainStatus,
    /// `<namespace>/<name>` from its metadata.
    owner: String,
    vmi_uid: Uuid,
}

/// The reconciler: the control plane, the nodes, and the stops in flight.
pub struct Reconciler {
    control_plane: Arc<dyn ControlPlane>,
    nodes: Nodes,
    options: ReconcilerOptions,
    stopping: Mutex<HashMap<Uuid, Stopping>>,
    /// Domain specs by VMI uid: a run's spec never changes, so it is mapped once and kept
    /// while the VMI is wanted.
    specs: Mutex<HashMap<Uuid, Arc<Result<DomainSpec, SpecError>>>>,
    /// Other logs' domains (node, domain UUID) seen by the last pass, so each is reported once.
    foreign: Mutex<HashSet<(String, Uuid)>>,
    /// Since when (ms since the epoch, the control plane's clock) each node's listing fails.
    unreachable_since: Mutex<HashMap<String, i64>>,
    calls: Arc<Calls>,
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("nodes", &self.nodes)
            .field("options", &self.options)
            .field(
                "stopping",
                &self.stopping.lock().map(|s| s.len()).unwrap_or_default(),
            )
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler over `nodes` for `control_plane`. Makes no call yet.
    pub fn new(
        control_plane: Arc<dyn ControlPlane>,
        nodes: Nodes,
        options: ReconcilerOptions,
    ) -> Reconciler {
        Reconciler {
            control_plane,
            nodes,
            options,
            stopping: Mutex::new(HashMap::new()),
            specs: Mutex::new(HashMap::new()),
            foreign: Mutex::new(HashSet::new()),
            unreachable_since: Mutex::new(HashMap::new()),
            calls: Arc::new(Calls::default()),
        }
    }

    /// Every libvirt call this reconciler made so far.
    pub fn calls(&self) -> CallCounts {
        self.calls.snapshot()
    }

    /// Runs one pass on the caller's thread (blocks on libvirt and the control plane).
    pub fn run_once(&mut self) -> PassReport {
        let before = self.calls.snapshot();
        let mut report = PassReport::default();
        self.pass(&mut report);
        report.calls = self.calls.snapshot().minus(&before);
        for action in &report.actions {
            tracing::info!(subject = %action.subject, step = action.step, why = %action.why, "reconciler acted");
        }
        for foreign in &report.foreign_domains {
            tracing::info!(%foreign, "another vmplane's domain: never touched");
        }
        for error in &report.errors {
            tracing::warn!(%error, "reconciler step failed; retrying on the next pass");
        }
        report
    }

    /// Runs passes on a thread of its own until the handle is dropped or stopped. Subscribes
    /// to every node's lifecycle events first; a node without events is only resynced.
    pub fn spawn(
        control_plane: Arc<dyn ControlPlane>,
        nodes: Nodes,
        options: ReconcilerOptions,
    ) -> Result<ReconcilerHandle, HypervisorError> {
        Reconciler::spawn_woken_by(control_plane, nodes, options, WakeHandle::default())
    }

    /// [`Reconciler::spawn`] woken by `wake`, a handle that outlives this reconciler: a server
    /// that runs a reconciler only while it leads hands its API one handle for all of them.
    pub fn spawn_woken_by(
        control_plane: Arc<dyn ControlPlane>,
        nodes: Nodes,
        options: ReconcilerOptions,
        wake: WakeHandle,
    ) -> Result<ReconcilerHandle, HypervisorError> {
        let reconciler = Reconciler::new(control_plane, nodes, options);
        reconciler.into_thread(wake)
    }

    fn into_thread(mut self, wake: WakeHandle) -> Result<ReconcilerHandle, HypervisorError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats {
            // Reachable until a pass says otherwise: each was opened a moment ago.
            nodes: Mutex::new(self.nodes.iter().map(|n| (n.name.clone(), true)).collect()),
            ..Stats::default()
        });
        let mut threads = Vec::new();
        for node in self.nodes.iter() {
            let events = match node.hypervisor.subscribe() {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(node = %node.name, error = %e, "no lifecycle events; resync only");
                    continue;
                }
            };
            let wake = wake.clone();
            let stop = Arc::clone(&stop);
            let thread = std::thread::Builder::new()
                .name(format!("vmplane-reconciler-events-{}", node.name))
                .spawn(move || {
                    loop {
                        match events.recv_timeout(Duration::from_millis(EVENT_POLL_MS)) {
                            Ok(_) => wake.wake(),
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                })
                .map_err(|e| spawn_error(&e))?;
            threads.push(thread);
        }
        let loop_wake = wake.clone();
        let loop_stop = Arc::clone(&stop);
        let loop_stats = Arc::clone(&stats);
        let calls = Arc::clone(&self.calls);
        let main = std::thread::Builder::new()
            .name("vmplane-reconciler".into())
            .spawn(move || {
                while !loop_stop.load(Ordering::SeqCst) {
                    let report = self.run_once();
                    loop_stats.record(&report);
                    let now = self.control_plane.now_ms();
                    let resync = i64::try_from(self.options.resync_interval_ms).unwrap_or(i64::MAX);
                    let wait_ms = report
                        .next_due_ms
                        .map_or(resync, |due| due.saturating_sub(now).clamp(0, resync));
                    loop_wake.wait(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)));
                }
            })
            .map_err(|e| spawn_error(&e))?;
        threads.push(main);
        Ok(ReconcilerHandle {
            wake,
            stop,
            stats,
            calls,
            threads,
        })
    }
}

/// How often an event-forwarding thread checks whether the reconciler stopped.
const EVENT_POLL_MS: u64 = 200;

fn spawn_error(e: &std::io::Error) -> HypervisorError {
    HypervisorError::Thread {
        reason: e.to_string(),
    }
}

/// Wakes a running reconciler for a pass now (after a control-plane write). Cheap to clone;
/// wake-ups that arrive during a pass coalesce into one more pass.
#[derive(Clone, Default)]
pub struct WakeHandle {
    inner: Arc<WakeInner>,
}

#[derive(Default)]
struct WakeInner {
    woken: Mutex<bool>,
    condvar: Condvar,
}

impl fmt::Debug for WakeHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeHandle").finish_non_exhaustive()
    }
}

impl WakeHandle {
    /// Asks for a pass as soon as the current one (if any) ends.
    pub fn wake(&self) {
        let mut woken = self.inner.woken.lock().unwrap_or_else(|p| p.into_inner());
        *woken = true;
        self.inner.condvar.notify_all();
    }

    /// Waits for a wake-up or `timeout`, whichever comes first, and consumes the wake-up.
    fn wait(&self, timeout: Duration) {
        let woken = self.inner.woken.lock().unwrap_or_else(|p| p.into_inner());
        let (mut woken, _) = self
            .inner
            .condvar
            .wait_timeout_while(woken, timeout, |w| !*w)
            .unwrap_or_else(|p| p.into_inner());
        *woken = false;
    }
}

/// What a running reconciler has done so far.
#[derive(Debug, Default)]
struct Stats {
    passes: AtomicU64,
    events_appended: AtomicU64,
    last_errors: Mutex<Vec<String>>,
    /// Every node, and whether the last pass could list it.
    nodes: Mutex<Vec<(String, bool)>>,
}

impl Stats {
    fn record(&self, report: &PassReport) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.events_appended
            .fetch_add(report.events_appended as u64, Ordering::Relaxed);
        *self.last_errors.lock().unwrap_or_else(|p| p.into_inner()) = report.errors.clone();
        for (node, reachable) in self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
        {
            *reachable = !report.unreachable_nodes.contains(node);
        }
    }
}

/// A reconciler running on its own thread. Dropping it stops the thread (after the pass in
/// progress, which may wait on a slow libvirt call) and joins it.
pub struct ReconcilerHandle {
    wake: WakeHandle,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    calls: Arc<Calls>,
    threads: Vec<JoinHandle<()>>,
}

impl fmt::Debug for ReconcilerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcilerHandle")
            .field("passes", &self.passes())
            .finish_non_exhaustive()
    }
}

impl ReconcilerHandle {
    /// Asks for a pass now (see [`WakeHandle::wake`]).
    pub fn wake(&self) {
        self.wake.wake();
    }

    /// A handle the gateway can keep to wake the reconciler after writes.
    pub fn wake_handle(&self) -> WakeHandle {
        self.wake.clone()
    }

    /// Passes run so far.
    pub fn passes(&self) -> u64 {
        self.stats.passes.load(Ordering::Relaxed)
    }

    /// Events appended by all passes so far.
    pub fn events_appended(&self) -> u64 {
        self.stats.events_appended.load(Ordering::Relaxed)
    }

    /// The errors of the last pass.
    pub fn last_errors(&self) -> Vec<String> {
        self.stats
            .last_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// libvirt calls made so far.
    pub fn calls(&self) -> CallCounts {
        self.calls.snapshot()
    }

    /// Every node, in the order given, and whether the last pass could list it (reachable).
    pub fn node_reachability(&self) -> Vec<(String, bool)> {
        self.stats
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the threads and waits for them.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.wake();
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a reconciler thread panicked");
            }
        }
    }
}

impl Drop for ReconcilerHandle {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Uids of the VMIs that may have a domain: every VM's current run and every standalone VMI.
fn wanted_vmis(vms: &[vmplane_core::VmState], vmis: &[vmplane_core::VmiState]) -> HashSet<Uuid> {
    vms.iter()
        .filter_map(|s| s.run.vmi.as_ref().map(|v| v.uid))
        .chain(vmis.iter().filter_map(|s| s.uid))
        .collect()
}

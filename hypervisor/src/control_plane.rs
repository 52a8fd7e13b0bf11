//! [`ControlPlane`]: what the reconciler needs from the rest of vmplane — the desired state
//! (VM and standalone VMI states, folded from the log) and a way to record what it did and saw
//! (commands decided by `core` and appended to the log).
//!
//! The trait keeps this crate independent of `projections` and `gateway`: the gateway
//! implements it over the projections' read models and its command path; this crate's tests
//! implement it over a real `vmplane_store::SledLog` with `core`'s `decide`/`fold`.

use std::collections::HashSet;

use uuid::Uuid;
use vmplane_core::{Features, Rejection, VmCommand, VmState, VmiCommand, VmiState};

/// The actor of every event the reconciler records (the envelope's `actor`).
pub const RECONCILER_ACTOR: &str = "system:reconciler";

/// The control-plane side of the reconciler. Every method **blocks** and is called only from
/// the reconciler's own thread (never from an async runtime worker), so an implementation may
/// wait on the store or a projection.
pub trait ControlPlane: Send + Sync {
    /// Every VM the reconciler must look at: each live VM, and each deleted VM whose state
    /// still holds a VMI run (so its domain is stopped and removed). Read from a state no
    /// older than the last command this control plane executed.
    fn vms(&self) -> Result<Vec<VmState>, ControlPlaneError>;

    /// Every standalone VMI (stream `vmi/<ns>/<name>`), including deleted ones whose domain
    /// may still exist (the reconciler stops and removes it). A deleted VMI left out is
    /// treated as an unwanted domain and destroyed without a grace period.
    fn standalone_vmis(&self) -> Result<Vec<VmiState>, ControlPlaneError>;

    /// Which of `uids` this control plane's log has ever recorded as the uid of a VMI: a VM's
    /// run (`VmiLaunched`) or a standalone VMI (`VmiCreated`), whether or not it still exists.
    ///
    /// This is what makes a domain this log's (see [`crate::reconciler`], "Whose domains"): a
    /// domain whose metadata names a VMI uid the log never recorded belongs to another vmplane
    /// (or was made by hand) and is never touched. VMI uids are random; only this log and
    /// copies of it (a backup restored elsewhere) recorded them.
    fn recorded_vmis(&self, uids: &[Uuid]) -> Result<HashSet<Uuid>, ControlPlaneError>;

    /// The cluster's effective features now (folded from `cluster/config`; every feature at
    /// its default when there is no configuration). A VM whose spec requests a disabled
    /// feature is not launched, and a standalone VMI that does is not scheduled.
    fn features(&self) -> Result<Features, ControlPlaneError>;

    /// Decides `command` on the VM stream `vm/<namespace>/<name>` with `core`, appends the
    /// events with actor [`RECONCILER_ACTOR`] (retrying on a revision conflict) and returns
    /// the state after them. A rejection appends nothing.
    fn execute(
        &self,
        namespace: &str,
        name: &str,
        command: VmCommand,
    ) -> Result<Executed<VmState>, ControlPlaneError>;

    /// The same for a standalone VMI stream `vmi/<namespace>/<name>`.
    fn execute_vmi(
        &self,
        namespace: &str,
        name: &str,
        command: VmiCommand,
    ) -> Result<Executed<VmiState>, ControlPlaneError>;

    /// The control plane's clock, in ms since the Unix epoch: the "now" its decisions use, so
    /// the reconciler's reading of `desired_action` (backoff) agrees with `decide`'s.
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// An executed command: the state after it and how many events it appended (0 when `core`
/// found nothing to record).
#[derive(Clone, Debug, PartialEq)]
pub struct Executed<S> {
    /// The aggregate's state after the command's events.
    pub state: S,
    /// Events appended.
    pub events_appended: usize,
}

/// Why the control plane did not execute a command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlPlaneError {
    /// `core` refused the command (e.g. a stale observation after someone else wrote).
    #[error("rejected: {0}")]
    Rejected(#[from] Rejection),
    /// The log or a read model failed; the reconciler retries on its next pass.
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
}

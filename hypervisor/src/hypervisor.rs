//! The [`Hypervisor`] trait: what the reconciler may ask of one node, and the plain types
//! its answers are made of. No libvirt type appears here, so a fake or another backend can
//! implement it.

use std::sync::mpsc::Receiver;

use uuid::Uuid;

use crate::error::HypervisorError;
use crate::spec::{DomainSpec, InstanceMetadata};

/// One node's view of its vmplane domains.
///
/// Every method **blocks** (a libvirt call can take seconds: a QEMU `destroy` waits for the
/// process to go). Call them from a thread of your own or from `tokio::task::spawn_blocking`,
/// never on an async runtime's worker. Implementations are shared between threads.
///
/// Domains are addressed by UUID (vmplane's firmware UUID). Every method that addresses a
/// domain first checks that it carries vmplane's metadata and answers
/// [`HypervisorError::NotOwned`] if it does not: a domain vmplane did not create is never
/// started, stopped, changed or removed. Stopping and starting are idempotent (stopping a
/// stopped domain, or starting a running one, succeeds), so a level-triggered caller can
/// repeat them.
pub trait Hypervisor: Send + Sync {
    /// The node's capacity: how many vCPUs and how much memory it has.
    fn node_capacity(&self) -> Result<Resources, HypervisorError>;

    /// Every domain on the node that carries vmplane's metadata, defined or running, with its
    /// state. Domains without it are left out. A domain whose vmplane metadata cannot be read
    /// is logged and left out too (adopting it would be a guess).
    fn list_owned(&self) -> Result<Vec<OwnedDomain>, HypervisorError>;

    /// Defines (or redefines) the domain. Refuses with `NotOwned` when a domain with the same
    /// UUID exists without vmplane's metadata.
    fn define(&self, spec: &DomainSpec) -> Result<(), HypervisorError>;

    /// Starts a defined domain; succeeds at once if it is already running.
    fn start(&self, uuid: Uuid) -> Result<(), HypervisorError>;

    /// Asks the guest to power off (ACPI); returns without waiting. Succeeds at once if the
    /// domain is not running. A guest that ignores it stays running: follow with `destroy`
    /// after a grace period.
    fn shutdown(&self, uuid: Uuid) -> Result<(), HypervisorError>;

    /// Powers the domain off at once; succeeds if it is not running.
    fn destroy(&self, uuid: Uuid) -> Result<(), HypervisorError>;

    /// Removes the domain's definition (and its NVRAM where the driver keeps one). A running
    /// domain keeps running as a transient one until it stops.
    fn undefine(&self, uuid: Uuid) -> Result<(), HypervisorError>;

    /// The domain's state and why it is in it.
    fn state(&self, uuid: Uuid) -> Result<DomainStatus, HypervisorError>;

    /// A new stream of lifecycle events of this node's domains. Events are hints for a
    /// level-triggered caller: they carry the UUID, and a caller acts only on UUIDs it owns.
    /// A subscriber that falls behind a bounded buffer loses events (never blocks the node),
    /// so a caller re-lists now and then. The stream ends when the hypervisor is dropped.
    fn subscribe(&self) -> Result<Receiver<LifecycleEvent>, HypervisorError>;
}

/// A number of vCPUs and an amount of memory: a node's capacity or a domain's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Resources {
    /// vCPUs.
    pub vcpus: u32,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

impl Resources {
    /// The resources a spec asks for.
    pub fn of(spec: &DomainSpec) -> Resources {
        Resources {
            vcpus: spec.vcpus(),
            memory_bytes: spec.memory_bytes,
        }
    }
}

/// A vmplane domain found on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedDomain {
    /// The libvirt name.
    pub name: String,
    /// The domain UUID (the firmware UUID).
    pub uuid: Uuid,
    /// What vmplane wrote into it: which VMI it runs.
    pub metadata: InstanceMetadata,
    /// Its state when listed.
    pub status: DomainStatus,
}

/// A domain's state, libvirt's `virDomainState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DomainState {
    /// No state.
    NoState,
    /// Running.
    Running,
    /// Blocked on a resource.
    Blocked,
    /// Paused.
    Paused,
    /// Being shut down.
    ShuttingDown,
    /// Shut off (defined, not running).
    Shutoff,
    /// Crashed.
    Crashed,
    /// Suspended by guest power management.
    PmSuspended,
    /// A state this libvirt added after vmplane was written.
    Unknown(i32),
}

/// A domain's state and the reason libvirt gives for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DomainStatus {
    /// The state.
    pub state: DomainState,
    /// libvirt's reason code for the state (`virDomain<State>Reason`).
    pub reason_code: i32,
}

impl DomainStatus {
    /// From libvirt's raw state and reason numbers.
    pub fn from_raw(state: i32, reason_code: i32) -> DomainStatus {
        let state = match state {
            0 => DomainState::NoState,
            1 => DomainState::Running,
            2 => DomainState::Blocked,
            3 => DomainState::Paused,
            4 => DomainState::ShuttingDown,
            5 => DomainState::Shutoff,
            6 => DomainState::Crashed,
            7 => DomainState::PmSuspended,
            other => DomainState::Unknown(other),
        };
        DomainStatus { state, reason_code }
    }

    /// The reason in libvirt's words (`booted`, `destroyed`, `crashed`, …), or `unknown`.
    pub fn reason(&self) -> &'static str {
        const RUNNING: &[&str] = &[
            "unknown",
            "booted",
            "migrated",
            "restored",
            "from snapshot",
            "unpaused",
            "migration canceled",
            "save canceled",
            "wakeup",
            "crashed",
            "post-copy",
            "post-copy failed",
        ];
        const PAUSED: &[&str] = &[
            "unknown",
            "user",
            "migration",
            "save",
            "dump",
            "I/O error",
            "watchdog",
            "from snapshot",
            "shutting down",
            "snapshot",
            "crashed",
            "starting up",
            "post-copy",
            "post-copy failed",
            "API error",
        ];
        const SHUTDOWN: &[&str] = &["unknown", "user"];
        const SHUTOFF: &[&str] = &[
            "unknown",
            "shutdown",
            "destroyed",
            "crashed",
            "migrated",
            "saved",
            "failed",
            "from snapshot",
            "daemon",
        ];
        const CRASHED: &[&str] = &["unknown", "panicked"];
        let table: &[&str] = match self.state {
            DomainState::Running => RUNNING,
            DomainState::Paused => PAUSED,
            DomainState::ShuttingDown => SHUTDOWN,
            DomainState::Shutoff => SHUTOFF,
            DomainState::Crashed => CRASHED,
            _ => &["unknown"],
        };
        usize::try_from(self.reason_code)
            .ok()
            .and_then(|i| table.get(i))
            .copied()
            .unwrap_or("unknown")
    }

    /// True while the domain has a running guest (running, blocked, paused, shutting down,
    /// PM-suspended): what `destroy` would end.
    pub fn is_active(&self) -> bool {
        !matches!(
            self.state,
            DomainState::Shutoff | DomainState::Crashed | DomainState::NoState
        )
    }
}

/// A lifecycle event of one domain (libvirt's `VIR_DOMAIN_EVENT_ID_LIFECYCLE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// The domain UUID.
    pub uuid: Uuid,
    /// The libvirt name.
    pub name: String,
    /// What happened.
    pub kind: LifecycleEventKind,
    /// libvirt's detail code for the kind (`virDomainEvent<Kind>DetailType`), e.g. for
    /// `Stopped`: 0 shutdown, 1 destroyed, 2 crashed, 5 failed.
    pub detail: i32,
}

/// libvirt's `virDomainEventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LifecycleEventKind {
    /// Defined or redefined.
    Defined,
    /// Undefined.
    Undefined,
    /// Started.
    Started,
    /// Paused.
    Suspended,
    /// Resumed.
    Resumed,
    /// Stopped; see the detail for why.
    Stopped,
    /// The guest is shutting down or has finished.
    Shutdown,
    /// Suspended by guest power management.
    PmSuspended,
    /// Crashed.
    Crashed,
    /// A kind this libvirt added after vmplane was written.
    Unknown(i32),
}

impl LifecycleEventKind {
    /// From libvirt's raw event number.
    pub fn from_raw(event: i32) -> LifecycleEventKind {
        match event {
            0 => LifecycleEventKind::Defined,
            1 => LifecycleEventKind::Undefined,
            2 => LifecycleEventKind::Started,
            3 => LifecycleEventKind::Suspended,
            4 => LifecycleEventKind::Resumed,
            5 => LifecycleEventKind::Stopped,
            6 => LifecycleEventKind::Shutdown,
            7 => LifecycleEventKind::PmSuspended,
            8 => LifecycleEventKind::Crashed,
            other => LifecycleEventKind::Unknown(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_like_libvirt() {
        assert_eq!(DomainStatus::from_raw(1, 1).reason(), "booted");
        assert_eq!(DomainStatus::from_raw(5, 2).reason(), "destroyed");
        assert_eq!(DomainStatus::from_raw(5, 99).reason(), "unknown");
        assert_eq!(DomainStatus::from_raw(5, -1).reason(), "unknown");
        assert_eq!(
            DomainStatus::from_raw(42, 0).state,
            DomainState::Unknown(42)
        );
        assert!(!DomainStatus::from_raw(5, 0).is_active());
        assert!(DomainStatus::from_raw(3, 1).is_active());
    }
}

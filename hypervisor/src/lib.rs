//! # vmplane-hypervisor
//!
//! **Owns** vmplane's side of the hypervisor: the [`Hypervisor`] trait, its libvirt
//! implementation ([`LibvirtHypervisor`]: lifecycle calls and libvirt's event-loop thread),
//! domain XML rendering and parsing, the nodes a VMI can be placed on, the mapping from
//! `core`'s expanded VMI to a domain, and the level-triggered **reconciler** that drives
//! libvirt toward what the log wants and records what it did and saw.
//!
//! Main types, in reading order:
//!
//! 1. [`DomainSpec`] (module [`spec`]): the hypervisor-level description of one domain —
//!    [`DomainName`], firmware UUID, [`CpuTopology`], memory, [`Firmware`], [`Disk`]s,
//!    [`Interface`]s and vmplane's [`InstanceMetadata`] (VM name, namespace, VMI uid, labels).
//! 2. [`domain_spec`] (module [`mapping`]): a VMI run, as `core` renders it, to a
//!    [`DomainSpec`], every problem with its KubeVirt field path; [`DomainDefaults`] carry what
//!    the node decides (domain type, emulator).
//! 3. [`render_domain`] and [`parse_metadata`] (module [`xml`]): the spec as libvirt domain XML,
//!    written with an escaping XML writer, and the metadata read back for adoption.
//! 4. [`Hypervisor`] (module [`hypervisor`]): what the reconciler may ask of one node, with
//!    [`DomainStatus`], [`LifecycleEvent`], [`OwnedDomain`] and [`Resources`].
//! 5. [`LibvirtHypervisor`] (module [`libvirt`]): the trait on one libvirt connection, with
//!    [`LibvirtOptions`]; [`libvirt::init`] starts libvirt's event-loop thread once per process.
//! 6. [`Nodes`] and [`place`] (module [`nodes`]): named connections and the placement of a VMI
//!    on a node with room, or [`Unschedulable`].
//! 7. [`ControlPlane`] (module [`control_plane`]): what the reconciler needs from the rest of
//!    vmplane — VM and standalone VMI states, the cluster's features, and commands executed
//!    through `core` with actor [`RECONCILER_ACTOR`]. The gateway implements it; this crate
//!    does not depend on `projections` or `store`.
//! 8. [`Reconciler`] (module [`reconciler`]): one pass of small named steps, each reporting
//!    why it acted ([`PassReport`], [`Action`]); [`Reconciler::spawn`] runs passes on a thread
//!    of its own, woken by libvirt events, by [`WakeHandle::wake`] and by a resync tick
//!    ([`ReconcilerHandle`]); [`CallCounts`] counts its libvirt calls.
//! 9. [`HypervisorError`] and [`SpecError`] (module [`error`]).
//!
//! ```no_run
//! use vmplane_hypervisor::{Hypervisor, Nodes, Resources};
//!
//! let nodes = Nodes::open(&["node1=test:///default"])?;
//! let node = nodes.place(Resources { vcpus: 1, memory_bytes: 1 << 30 }, [], &Default::default())?;
//! // Blocking: in async code, run this in `tokio::task::spawn_blocking`.
//! for domain in node.hypervisor.list_owned()? {
//!     println!("{} runs {}/{}", domain.name, domain.metadata.namespace, domain.metadata.name);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Must never**:
//!
//! - block a tokio worker with a libvirt call: every [`Hypervisor`] method blocks, and callers
//!   run them on threads of their own or in `spawn_blocking`; the reconciler runs on std
//!   threads of its own;
//! - touch a libvirt domain that does not carry vmplane's metadata (an `instance` element in
//!   the [`METADATA_NAMESPACE_URI`] namespace): a host runs other guests, and libvirt's test
//!   driver starts with a domain `test` of its own; nor one whose VMI uid the log never
//!   recorded ([`ControlPlane::recorded_vmis`]): another vmplane server's;
//! - record a VMI `Failed` because its node does not answer: its guest may still run;
//! - build XML by string formatting, or let a value XML cannot carry reach libvirt;
//! - decide a domain rule itself: what should run is `core`'s `desired_action`, and every
//!   observation goes through `core`'s `decide` (via [`ControlPlane`]), which may refuse it.

#![deny(missing_docs)]

pub mod control_plane;
pub mod error;
pub mod hypervisor;
pub mod libvirt;
pub mod mapping;
pub mod nodes;
#[cfg(feature = "qemu-harness")]
pub mod qemu_harness;
pub mod reconciler;
pub mod spec;
pub mod xml;

pub use control_plane::{ControlPlane, ControlPlaneError, Executed, RECONCILER_ACTOR};
pub use error::{DomainRef, HypervisorError, MetadataError, SpecError, SpecProblem};
pub use hypervisor::{
    DomainState, DomainStatus, Hypervisor, LifecycleEvent, LifecycleEventKind, OwnedDomain,
    Resources,
};
pub use libvirt::{LibvirtHypervisor, LibvirtOptions};
pub use mapping::{DomainDefaults, domain_spec};
pub use nodes::{Node, Nodes, NodesError, Unschedulable, place};
pub use reconciler::{
    Action, CallCounts, PassReport, Reconciler, ReconcilerHandle, ReconcilerOptions, WakeHandle,
};
pub use spec::{
    CpuTopology, Disk, DiskBus, DiskDevice, DiskFormat, DomainName, DomainSpec, Firmware,
    InstanceMetadata, Interface, InterfaceSource, MACHINE_TYPE_DEFAULT, METADATA_NAMESPACE_URI,
    MacAddress, NicModel, VirtType,
};
pub use xml::{parse_metadata, render_domain};

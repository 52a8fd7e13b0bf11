//! # vmplane-core
//!
//! vmplane's pure domain. The event log is the source of truth; this crate says what may be
//! appended to it and what the events mean.
//!
//! ## What core owns
//!
//! * **Types** in KubeVirt's shape ([`types`]): VirtualMachine, VirtualMachineInstance,
//!   instancetypes and preferences (namespaced and cluster), KubeVirt, snapshot, restore,
//!   clone — parsed from YAML/JSON with every unknown field kept, behind size and shape limits
//!   ([`limits`], [`types::parse_manifests`]); exact [`quantity::Quantity`]s.
//! * **Commands, events and decisions**: per aggregate ([`aggregate`]),
//!   `decide(&state, &command, &mut ctx) -> Result<Decision, Rejection>` and
//!   `evolve(state, &event) -> state`. A [`Decision`] carries the events, the cross-stream
//!   uniqueness [`Claim`]s the store enforces atomically with the append (one live VM per
//!   firmware UUID), and the [`Outcome`] (`created|configured|unchanged|…`).
//! * **Event encoding** ([`event`]): frozen, versioned rkyv payloads, a registry
//!   ([`event::encode`], [`event::decode`] with upcasting, [`event::validate_payload`]).
//! * **Validation** ([`validate`]) collecting every cause with its field path, separate from
//!   **defaulting** ([`defaults`]); typed [`Rejection`]s with stable codes and a [`Category`]
//!   that maps to gRPC.
//! * **Firmware UUID rules** ([`firmware`], semantics.md §1), **instancetype expansion**
//!   ([`instancetype`]), and **lifecycle/status** as pure functions of state ([`lifecycle`]:
//!   `desired_action`, `printable_status`, `conditions`, `render`, all taking the cluster's
//!   effective [`Features`]).
//! * **Snapshots, restores and clones** (semantics.md §1 rows 8–11 and §5):
//!   [`snapshot`] captures a VM at one log position (spec at its revision, firmware UUID and
//!   serial, instancetype/preference revisions); [`restore`] puts a snapshot back onto the same
//!   VM or into a new one with KubeVirt's target readiness policies; [`clone`] copies a VM or a
//!   snapshot into a new VM with a new identity and KubeVirt's label/annotation filters and
//!   patches ([`jsonpatch`]). Restore and clone are small sagas across two streams: their
//!   `decide` returns a [`SagaDecision`] whose [`Next`] tells the gateway which [`VmCommand`]
//!   to decide on the target VM stream before it calls `Progress` again. All three require the
//!   `Snapshot` feature gate; disk contents are out of scope.
//! * **Label selectors** ([`selector`]): Kubernetes' selector syntax (`app=web,env in (a,b),!canary`)
//!   parsed with the requirement named in every refusal, and matched against an object's labels.
//! * **Cluster feature configuration** ([`features`], semantics.md §6): KubeVirt's feature
//!   gates with their stages and `IsEnabled` rules, feature configurables, validation of the
//!   `KubeVirt` object, the effective state of every feature, the features a VM requests (with
//!   the field), and [`features::require_feature`] for commands gated by a feature.
//!
//! ## Main types, in reading order
//!
//! [`Ctx`] → [`types::Manifest`] / [`types::VirtualMachine`] → [`VmCommand`] →
//! [`vm::decide`] → [`Decision`] (with [`Event`]s and [`Claim`]s) or [`Rejection`] →
//! [`vm::evolve`] → [`VmState`] → [`lifecycle::render`] / [`lifecycle::desired_action`];
//! then [`SnapshotCommand`] → [`snapshot::decide`] → [`SnapshotState`] →
//! [`snapshot::render_snapshot`], and [`RestoreCommand`] / [`CloneCommand`] →
//! [`restore::decide`] / [`clone::decide`] → [`SagaDecision`] ([`Next`]).
//!
//! ## Streams and claims
//!
//! `vm/<ns>/<name>` (a VM and its VMI runs), `vmi/<ns>/<name>` (standalone VMIs),
//! `instancetype/<ns>/<name>`, `clusterinstancetype/<name>`, `preference/<ns>/<name>`,
//! `clusterpreference/<name>`, `cluster/config` (the [`object`] aggregate), and
//! `snapshot/<ns>/<name>`, `restore/<ns>/<name>`, `clone/<ns>/<name>` (the [`snapshot`],
//! [`restore`] and [`clone`] aggregates: the object aggregate's `ObjectCreated`/`ObjectDeleted`
//! followed by their own events, so [`object::evolve`] still folds them) ([`decision::streams`]).
//! Claim keys: `firmware-uuid/<uuid>`, owned by the stream name; a restore or clone claims its
//! target's UUID through the target VM's own `VmCreated`/`FirmwareUuidAssigned` append.
//!
//! ## What core must never do
//!
//! No I/O, no clock, no randomness except through [`Ctx`], no tokio, sled or tonic. A
//! command's effect depends only on the state, the command and the ctx, so a seed replays any
//! scenario exactly. Nothing from outside can make it panic.
//!
//! ## Example
//!
//! ```
//! use vmplane_core::{Ctx, Outcome, PutVm, VmCommand, VmState, types, vm};
//!
//! let yaml = br#"
//! apiVersion: kubevirt.io/v1
//! kind: VirtualMachine
//! metadata: {name: testvm, namespace: default}
//! spec:
//!   runStrategy: Halted
//!   template:
//!     spec:
//!       domain: {memory: {guest: 128Mi}, devices: {}}
//! "#;
//! let types::Manifest::VirtualMachine(manifest) = types::parse_manifest(yaml).unwrap() else {
//!     unreachable!()
//! };
//! let mut ctx = Ctx::at_secs(1_700_000_000, 42);
//! let state = VmState::default(); // the gateway folds the stream with vm::evolve
//! let decision = vm::decide(&state, &VmCommand::Create(Box::new(PutVm::new(*manifest))), &mut ctx).unwrap();
//! assert_eq!(decision.outcome, Outcome::Created);
//! assert_eq!(decision.claims.len(), 1); // firmware-uuid/<random v4>, owned by vm/default/testvm
//! let state = decision.events.iter().fold(state, vm::evolve);
//! assert_eq!(state.generation, 1);
//! ```

#![warn(missing_docs)]

pub mod aggregate;
pub mod ctx;
pub mod decision;
pub mod defaults;
pub mod error;
pub mod event;
pub mod features;
pub mod firmware;
pub mod instancetype;
pub mod jsonpatch;
pub mod lifecycle;
pub mod limits;
pub mod quantity;
pub mod schema;
pub mod selector;
pub mod types;
pub mod validate;

pub use aggregate::clone::{self, CloneCommand, CloneInput, CloneSource, CloneState};
pub use aggregate::dataprotection::{Next, SagaDecision};
pub use aggregate::object::{self, ObjectCommand, ObjectState};
pub use aggregate::restore::{self, RestoreCommand, RestoreInput, RestoreState};
pub use aggregate::snapshot::{self, ImportSnapshot, SnapshotCommand, SnapshotState, TakeSnapshot};
pub use aggregate::vm::{self, PutVm, VmCommand, VmState, VmiObservation};
pub use aggregate::vmi::{self, VmiCommand, VmiState};
pub use ctx::Ctx;
pub use decision::{Claim, Decision, Outcome, streams};
pub use error::{Category, Cause, Holder, Rejection, codes};
pub use event::{DecodeError, EncodedEvent, Event, decode, encode, validate_payload};
pub use features::{FeatureStatus, FeatureUse, Features};
pub use quantity::Quantity;

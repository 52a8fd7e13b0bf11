//! What a stream is and how its state is folded: stream names → kinds, [`AggState`] (one of
//! core's aggregate states), and [`Snapshot`] (a state plus what rendering needs: the position
//! and time of its last event and when the current life began).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use uuid::Uuid;
use vmplane_core::types::{Kind, VirtualMachine};
use vmplane_core::{
    CloneState, Event, ObjectState, RestoreState, SnapshotState, VmState, VmiState, clone, object,
    restore, snapshot, vm, vmi,
};

use vmplane_store::{Position, RecordedEventRef};

use crate::error::{Error, Result};
use crate::render::VmTemplate;

/// What a stream name says: the kind, the namespace (None for cluster-scoped kinds and the
/// cluster config) and the name (empty for `cluster/config`, whose name is in its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamName<'a> {
    /// The kind of the stream's objects.
    pub kind: Kind,
    /// The namespace.
    pub namespace: Option<&'a str>,
    /// The name.
    pub name: &'a str,
}

/// Parses a stream name as core names them ([`vmplane_core::streams`]). `None` for streams
/// vmplane does not know (they are skipped by the read models, never an error).
#[must_use]
pub fn parse_stream(stream: &str) -> Option<StreamName<'_>> {
    if stream == vmplane_core::streams::CLUSTER_CONFIG {
        return Some(StreamName {
            kind: Kind::KubeVirt,
            namespace: None,
            name: "",
        });
    }
    let (prefix, rest) = stream.split_once('/')?;
    let kind = match prefix {
        "vm" => Kind::VirtualMachine,
        "vmi" => Kind::VirtualMachineInstance,
        "instancetype" => Kind::VirtualMachineInstancetype,
        "clusterinstancetype" => Kind::VirtualMachineClusterInstancetype,
        "preference" => Kind::VirtualMachinePreference,
        "clusterpreference" => Kind::VirtualMachineClusterPreference,
        "snapshot" => Kind::VirtualMachineSnapshot,
        "restore" => Kind::VirtualMachineRestore,
        "clone" => Kind::VirtualMachineClone,
        "pool" => Kind::VirtualMachinePool,
        "replicaset" => Kind::VirtualMachineInstanceReplicaSet,
        "migration" => Kind::VirtualMachineInstanceMigration,
        _ => return None,
    };
    if kind.namespaced() {
        let (namespace, name) = rest.split_once('/')?;
        Some(StreamName {
            kind,
            namespace: Some(namespace),
            name,
        })
    } else {
        Some(StreamName {
            kind,
            namespace: None,
            name: rest,
        })
    }
}

/// The stream of an object (`namespace` ignored for cluster-scoped kinds).
#[must_use]
pub fn stream_of(kind: Kind, namespace: &str, name: &str) -> String {
    vmplane_core::streams::for_object(kind, namespace, name)
}

/// The folded state of one stream: the aggregate core defines for its kind.
#[derive(Debug, Clone, PartialEq)]
pub enum AggState {
    /// `vm/<ns>/<name>` (boxed: core's `VmState` is a few KB inline).
    Vm(Box<VmState>),
    /// `vmi/<ns>/<name>` (standalone VMIs).
    Vmi(Box<VmiState>),
    /// `snapshot/<ns>/<name>` (core's snapshot aggregate; its `object` is the object fold).
    Snapshot(Box<SnapshotState>),
    /// `restore/<ns>/<name>` (core's restore saga aggregate).
    Restore(Box<RestoreState>),
    /// `clone/<ns>/<name>` (core's clone saga aggregate).
    Clone(Box<CloneState>),
    /// Every other managed kind.
    Object(Box<ObjectState>),
}

impl AggState {
    /// The state of a stream of `kind` with no events.
    #[must_use]
    pub fn empty(kind: Kind) -> AggState {
        match kind {
            Kind::VirtualMachine => AggState::Vm(Box::default()),
            Kind::VirtualMachineInstance => AggState::Vmi(Box::default()),
            Kind::VirtualMachineSnapshot => AggState::Snapshot(Box::default()),
            Kind::VirtualMachineRestore => AggState::Restore(Box::default()),
            Kind::VirtualMachineClone => AggState::Clone(Box::default()),
            _ => AggState::Object(Box::default()),
        }
    }

    /// Folds one event with core's `evolve`, in place.
    pub fn evolve(&mut self, event: &Event) {
        match self {
            // In place: a long fold (time travel) must not move the state per event.
            AggState::Vm(s) => vm::evolve_in_place(s, event),
            AggState::Vmi(s) => **s = vmi::evolve(std::mem::take(&mut **s), event),
            AggState::Snapshot(s) => **s = snapshot::evolve(std::mem::take(&mut **s), event),
            AggState::Restore(s) => **s = restore::evolve(std::mem::take(&mut **s), event),
            AggState::Clone(s) => **s = clone::evolve(std::mem::take(&mut **s), event),
            AggState::Object(s) => **s = object::evolve(std::mem::take(&mut **s), event),
        }
    }

    /// The object fold of a snapshot, restore, clone or other object stream (`None` for VMs
    /// and VMIs).
    #[must_use]
    pub fn object(&self) -> Option<&ObjectState> {
        match self {
            AggState::Vm(_) | AggState::Vmi(_) => None,
            AggState::Snapshot(s) => Some(&s.object),
            AggState::Restore(s) => Some(&s.object),
            AggState::Clone(s) => Some(&s.object),
            AggState::Object(s) => Some(s),
        }
    }

    /// Events folded so far (the stream revision).
    #[must_use]
    pub fn revision(&self) -> u64 {
        match self {
            AggState::Vm(s) => s.revision,
            AggState::Vmi(s) => s.revision,
            AggState::Snapshot(s) => s.object.revision,
            AggState::Restore(s) => s.object.revision,
            AggState::Clone(s) => s.object.revision,
            AggState::Object(s) => s.revision,
        }
    }

    /// The uid of the object living under the stream's name (`None` if none lives).
    #[must_use]
    pub fn uid(&self) -> Option<Uuid> {
        if !self.is_live() {
            return None;
        }
        match self {
            AggState::Vm(s) => s.uid,
            AggState::Vmi(s) => s.uid,
            AggState::Snapshot(s) => s.object.uid,
            AggState::Restore(s) => s.object.uid,
            AggState::Clone(s) => s.object.uid,
            AggState::Object(s) => s.uid,
        }
    }

    /// Whether an object lives under the stream's name (a VM being deleted, Terminating while
    /// its VMI stops, included: it is still there to read).
    #[must_use]
    pub fn is_live(&self) -> bool {
        match self {
            AggState::Vm(s) => s.exists(),
            AggState::Vmi(s) => s.is_live(),
            AggState::Snapshot(s) => s.is_live(),
            AggState::Restore(s) => s.is_live(),
            AggState::Clone(s) => s.is_live(),
            AggState::Object(s) => s.is_live(),
        }
    }

    /// `metadata.generation`: object changes (VMI lifecycle events do not count). For a
    /// standalone VMI (immutable) it is 1 while it lives.
    #[must_use]
    pub fn generation(&self) -> u64 {
        match self {
            AggState::Vm(s) => s.generation,
            AggState::Vmi(s) => u64::from(s.uid.is_some()),
            AggState::Snapshot(s) => s.object.generation,
            AggState::Restore(s) => s.object.generation,
            AggState::Clone(s) => s.object.generation,
            AggState::Object(s) => s.generation,
        }
    }
}

/// A VM state's stored object serialized once ([`vmplane_core::lifecycle::render_object`] with
/// a `status` placeholder where the status goes), for the states folded from one snapshot to
/// share: rendering one of them clones this tree instead of cloning the typed VM and
/// serializing it again. It is a cache of a pure function of `(vm, uid, generation,
/// deletion)` (a Terminating VM's `metadata.deletionTimestamp`), which it records and is
/// checked against before use; [`Snapshot::apply`] starts a new one when a
/// fold changes any of them.
#[derive(Clone, Default)]
pub(crate) struct VmJson(Arc<OnceLock<VmJsonEntry>>);

struct VmJsonEntry {
    vm: Arc<VirtualMachine>,
    uid: Option<Uuid>,
    generation: u64,
    /// When a deletion of the VM was asked for, if it is Terminating.
    deletion_ms: Option<i64>,
    object: Value,
    /// The object's text for [`crate::render::render_json`], made on first use.
    template: OnceLock<VmTemplate>,
}

impl VmJson {
    /// Whether the memo was made (by a read that needed it).
    #[cfg(test)]
    pub(crate) fn filled(&self) -> bool {
        self.0.get().is_some()
    }

    /// The memo, made from `state` if it is the first use; `None` if no VM object is stored.
    fn entry(&self, state: &VmState) -> Option<&VmJsonEntry> {
        let vm = state.vm.as_ref()?;
        Some(self.0.get_or_init(|| VmJsonEntry {
            vm: Arc::clone(vm),
            uid: state.uid,
            generation: state.generation,
            deletion_ms: deletion_ms(state),
            object: serialize_with_status_slot(state).unwrap_or(Value::Null),
            template: OnceLock::new(),
        }))
    }

    /// The object of `state` rendered without its status, whose value is `null` (the key is
    /// in place, so the caller's status lands where serializing the whole VM puts it). `None`
    /// if no VM object is stored.
    pub(crate) fn object(&self, state: &VmState) -> Option<Value> {
        let entry = self.entry(state)?;
        if entry.matches(state) && !entry.object.is_null() {
            Some(entry.object.clone())
        } else {
            serialize_with_status_slot(state)
        }
    }

    /// The text template of `state`'s object (created at `created_at_ns`): the memo's when it
    /// fits, else one made for this call. `None` if no VM object is stored.
    pub(crate) fn template(
        &self,
        state: &VmState,
        created_at_ns: Option<i64>,
    ) -> Option<Cow<'_, VmTemplate>> {
        let entry = self.entry(state)?;
        if entry.matches(state) && !entry.object.is_null() {
            let template = entry
                .template
                .get_or_init(|| VmTemplate::new(entry.object.clone(), state, created_at_ns));
            if template.fits(state, created_at_ns) {
                return Some(Cow::Borrowed(template));
            }
            return Some(Cow::Owned(VmTemplate::new(
                entry.object.clone(),
                state,
                created_at_ns,
            )));
        }
        Some(Cow::Owned(VmTemplate::new(
            serialize_with_status_slot(state)?,
            state,
            created_at_ns,
        )))
    }

    /// Whether a fold from `before` to `after` leaves the memo valid.
    fn still_valid(before: &VmKey, after: &VmState) -> bool {
        before.0 == after.vm.as_ref().map(Arc::as_ptr)
            && before.1 == after.uid
            && before.2 == after.generation
            && before.3 == deletion_ms(after)
    }
}

type VmKey = (
    Option<*const VirtualMachine>,
    Option<Uuid>,
    u64,
    Option<i64>,
);

fn vm_key(state: &AggState) -> Option<VmKey> {
    match state {
        AggState::Vm(s) => Some((
            s.vm.as_ref().map(Arc::as_ptr),
            s.uid,
            s.generation,
            deletion_ms(s),
        )),
        _ => None,
    }
}

/// When the deletion of a Terminating VM was asked for (its rendered
/// `metadata.deletionTimestamp`); `None` for any other.
fn deletion_ms(state: &VmState) -> Option<i64> {
    state.terminating().map(|d| d.at_ms)
}

impl VmJsonEntry {
    fn matches(&self, state: &VmState) -> bool {
        state
            .vm
            .as_ref()
            .is_some_and(|vm| Arc::ptr_eq(vm, &self.vm))
            && state.uid == self.uid
            && state.generation == self.generation
            && deletion_ms(state) == self.deletion_ms
    }
}

fn serialize_with_status_slot(state: &VmState) -> Option<Value> {
    let mut vm = vmplane_core::lifecycle::render_object(state)?;
    vm.status = Some(Value::Null);
    serde_json::to_value(&vm).ok()
}

impl PartialEq for VmJson {
    /// A cache: never part of what a snapshot is.
    fn eq(&self, _: &VmJson) -> bool {
        true
    }
}

impl std::fmt::Debug for VmJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VmJson")
    }
}

/// A stream's state at one revision, with what rendering it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The folded state (`state.revision()` events).
    pub state: AggState,
    /// The position of the last folded event (`Position(0)` for none).
    pub position: Position,
    /// When the last folded event was recorded (ns since the epoch).
    pub recorded_at_ns: i64,
    /// When the current (or last) life of the name was created (ns since the epoch).
    pub created_at_ns: Option<i64>,
    /// The VM object serialized once for the states that share it (VM streams only).
    pub(crate) vm_json: VmJson,
    /// In a VM's stream, the position of the last event about its VMI (`Vmi…`): the VMI's
    /// `resourceVersion` (`Position(0)` for none).
    pub vmi_position: Position,
}

impl Snapshot {
    /// A stream of `kind` before its first event.
    #[must_use]
    pub fn empty(kind: Kind) -> Snapshot {
        Snapshot {
            state: AggState::empty(kind),
            position: Position(0),
            recorded_at_ns: 0,
            created_at_ns: None,
            vm_json: VmJson::default(),
            vmi_position: Position(0),
        }
    }

    /// Which serialized-object memo the snapshot holds: it changes when a fold changes the
    /// stored object (states with the same id share one serialized object).
    pub(crate) fn object_id(&self) -> usize {
        Arc::as_ptr(&self.vm_json.0) as usize
    }

    /// Folds one recorded event, checking that its revision is the next one (a pair assertion
    /// with the store's own check at append).
    pub fn apply(&mut self, event: &RecordedEventRef<'_>) -> Result<()> {
        let expected = self.state.revision() + 1;
        if event.revision != expected {
            return Err(Error::Corrupt {
                position: event.position,
                reason: format!(
                    "stream {} revision {} where {} was expected",
                    event.stream, event.revision, expected
                ),
            });
        }
        let decoded = decode(event)?;
        if matches!(
            decoded,
            Event::VmCreated(_) | Event::VmiCreated(_) | Event::ObjectCreated(_)
        ) {
            self.created_at_ns = Some(event.recorded_at.0);
        }
        let before = vm_key(&self.state);
        self.state.evolve(&decoded);
        if let (Some(before), AggState::Vm(after)) = (before, &self.state)
            && !VmJson::still_valid(&before, after)
        {
            self.vm_json = VmJson::default();
        }
        self.position = event.position;
        self.recorded_at_ns = event.recorded_at.0;
        self.note_vmi_event(event.event_type, event.position);
        Ok(())
    }

    /// Records `position` as the VMI's last event if the event (of type `event_type`, folded
    /// into this snapshot) is about the VMI of a VM's stream.
    pub(crate) fn note_vmi_event(&mut self, event_type: &str, position: Position) {
        if matches!(self.state, AggState::Vm(_))
            && crate::history::event_kind(Kind::VirtualMachine, event_type)
                == Kind::VirtualMachineInstance
        {
            self.vmi_position = position;
        }
    }
}

/// Decodes an event's payload with core's registry; damage names the position.
pub fn decode(event: &RecordedEventRef<'_>) -> Result<Event> {
    vmplane_core::decode(event.event_type, event.schema_version, event.payload).map_err(|e| {
        Error::Corrupt {
            position: event.position,
            reason: e.to_string(),
        }
    })
}

/// RFC 3339 (UTC, seconds) of a time in ns since the epoch, as Kubernetes writes times.
#[must_use]
pub fn rfc3339(ns: i64) -> String {
    let dt = chrono::DateTime::<chrono::Utc>::from_timestamp(
        ns.div_euclid(1_000_000_000),
        u32::try_from(ns.rem_euclid(1_000_000_000)).unwrap_or(0),
    )
    .unwrap_or_default();
    dt.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// RFC 3339 with nanoseconds (history, audit, watch: events a second apart must stay apart).
#[must_use]
pub fn rfc3339_nanos(ns: i64) -> String {
    let dt = chrono::DateTime::<chrono::Utc>::from_timestamp(
        ns.div_euclid(1_000_000_000),
        u32::try_from(ns.rem_euclid(1_000_000_000)).unwrap_or(0),
    )
    .unwrap_or_default();
    dt.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_parse() {
        let s = parse_stream("vm/default/demo").expect("vm");
        assert_eq!(
            (s.kind, s.namespace, s.name),
            (Kind::VirtualMachine, Some("default"), "demo")
        );
        let s = parse_stream("clusterinstancetype/u1.medium").expect("cluster");
        assert_eq!(
            (s.kind, s.namespace, s.name),
            (Kind::VirtualMachineClusterInstancetype, None, "u1.medium")
        );
        assert_eq!(
            parse_stream("cluster/config").map(|s| s.kind),
            Some(Kind::KubeVirt)
        );
        assert!(parse_stream("bench/1").is_none());
        assert!(parse_stream("vm/only-namespace").is_none());
        for kind in Kind::ALL {
            let stream = stream_of(kind, "ns", "n");
            let parsed = parse_stream(&stream).expect("round trip");
            assert_eq!(parsed.kind, kind, "{stream}");
        }
    }
}

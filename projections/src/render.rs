//! Objects in KubeVirt's JSON shape (INTERFACE.md "JSON and YAML objects"): the stored object
//! as core renders it, plus what only the log knows — `resourceVersion` (the position of the
//! object's last event) and `creationTimestamp`.

use std::io::Write as _;

use serde_json::{Map, Value, json};
use vmplane_core::features::Features;
use vmplane_core::lifecycle::{self, VmStatus};
use vmplane_core::types::{Kind, VirtualMachineView};
use vmplane_core::{VmState, VmiState};
use vmplane_store::Position;

use crate::model::{AggState, Snapshot, rfc3339};

/// One object as a reader sees it: its metadata and the whole object in KubeVirt's JSON
/// shape, as a JSON tree ([`ObjectView`]) or as compact JSON text ([`ObjectJson`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered<B> {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace (None for cluster-scoped kinds).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.generation`.
    pub generation: u64,
    /// `metadata.resourceVersion`: the position of the object's last event.
    pub resource_version: Position,
    /// The whole object in KubeVirt's JSON shape.
    pub object: B,
}

/// An object with its JSON tree.
pub type ObjectView = Rendered<Value>;

/// An object as the gateway answers a read: the JSON text, byte for byte what the tree's
/// `to_string()` gives.
pub type ObjectJson = Rendered<String>;

impl<B> Rendered<B> {
    /// The same object's metadata with `object` as its body (a basic view's `()`, a text).
    #[must_use]
    pub fn with_object<C>(self, object: C) -> Rendered<C> {
        Rendered {
            object,
            kind: self.kind,
            namespace: self.namespace,
            name: self.name,
            uid: self.uid,
            generation: self.generation,
            resource_version: self.resource_version,
        }
    }
}

impl ObjectView {
    /// The object's `spec` (Null if it has none).
    #[must_use]
    pub fn spec(&self) -> &Value {
        self.object.get("spec").unwrap_or(&Value::Null)
    }

    /// The same object as compact JSON text.
    #[must_use]
    pub fn into_json(self) -> ObjectJson {
        let text = self.object.to_string();
        self.with_object(text)
    }
}

/// Renders `kind` from a snapshot of its stream, given the cluster's effective `features` and
/// `now_ms` at that point (VM status depends on both: disabled features, crash-loop backoff).
/// `None` when no such object lives at that revision.
#[must_use]
pub fn render(
    snapshot: &Snapshot,
    kind: Kind,
    features: &Features,
    now_ms: i64,
) -> Option<ObjectView> {
    match (&snapshot.state, kind) {
        (AggState::Vm(s), Kind::VirtualMachine) => render_vm(snapshot, s, features, now_ms),
        (AggState::Vm(s), Kind::VirtualMachineInstance) => render_vm_vmi(snapshot, s),
        (AggState::Vmi(s), Kind::VirtualMachineInstance) => render_vmi(snapshot, s, features),
        (AggState::Snapshot(x), _) => {
            render_object(snapshot, &x.object, vmplane_core::snapshot::render(x)?)
        }
        (AggState::Restore(x), _) => {
            render_object(snapshot, &x.object, vmplane_core::restore::render(x)?)
        }
        (AggState::Clone(x), _) => {
            render_object(snapshot, &x.object, vmplane_core::clone::render(x)?)
        }
        (AggState::Object(s), _) => render_object(snapshot, s, s.render()?),
        _ => None,
    }
}

/// [`render`] as JSON text: exactly `render(..).object.to_string()` with the same metadata. A
/// VM's text is its stored object's text (see [`VmTemplate`]) with this state's status and
/// resourceVersion written in, so no JSON tree of the object is built per read; other kinds,
/// and a VM whose text cannot be templated, are rendered through [`render`].
#[must_use]
pub fn render_json(
    snapshot: &Snapshot,
    kind: Kind,
    features: &Features,
    now_ms: i64,
) -> Option<ObjectJson> {
    render_text(snapshot, kind, features, now_ms, render_vm_json)
}

/// [`render`] as JSON text for an object rendered once, a write's answer: exactly
/// `render(..).object.to_string()` with the same metadata. A VM is serialized straight from
/// its typed object, with no JSON tree and without filling the snapshot's memo (which a state
/// read once would only carry until the cache drops it); other kinds, and a VM whose text the
/// typed object does not give as it is (see [`render_vm_direct`]), through [`render`].
#[must_use]
pub fn render_once_json(
    snapshot: &Snapshot,
    kind: Kind,
    features: &Features,
    now_ms: i64,
) -> Option<ObjectJson> {
    render_text(snapshot, kind, features, now_ms, render_vm_direct)
}

/// What a write's answer carries in its basic view (everything but the object's text): a
/// VM's kind, namespace, name, uid, generation and resource version, from its state alone,
/// with nothing rendered. They are the fields [`render_once_json`] gives the same snapshot.
/// `None` for other kinds and for a VM that does not exist (a Terminating one does): the
/// caller renders those as usual, then leaves the text out.
#[must_use]
pub fn header(snapshot: &Snapshot, kind: Kind) -> Option<Rendered<()>> {
    match (&snapshot.state, kind) {
        (AggState::Vm(s), Kind::VirtualMachine) if s.exists() => Some(vm_rendered(s, snapshot, ())),
        _ => None,
    }
}

/// How a live VM's text, with its `status`, is made without its tree; `None` to take the tree.
type VmText = fn(&Snapshot, &VmState, &VmStatus) -> Option<ObjectJson>;

/// A live VM's text through `vm` where it gives one (a VM that is not live renders nothing);
/// anything else through [`render`].
fn render_text(
    snapshot: &Snapshot,
    kind: Kind,
    features: &Features,
    now_ms: i64,
    vm: VmText,
) -> Option<ObjectJson> {
    if let (AggState::Vm(s), Kind::VirtualMachine) = (&snapshot.state, kind) {
        let status = lifecycle::vm_status(s, features, now_ms)?;
        if let Some(text) = vm(snapshot, s, &status) {
            return Some(text);
        }
    }
    render(snapshot, kind, features, now_ms).map(ObjectView::into_json)
}

/// A live VM serialized from its typed object with `status`, or `None` when that would not
/// give the tree's text — the tree appends `resourceVersion` and `creationTimestamp` to `metadata`
/// and the firmware identity to `domain.firmware` only where the stored object lacks them, so
/// a stored object holding any of the first two, or lacking the firmware identity its state
/// has (written before it was stored in the spec), takes the tree.
fn render_vm_direct(snapshot: &Snapshot, s: &VmState, status: &VmStatus) -> Option<ObjectJson> {
    let vm = s.vm.as_deref()?;
    let mut meta = lifecycle::render_metadata(s)?;
    if meta.resource_version.is_some()
        || meta.extra.contains_key("resourceVersion")
        || meta.extra.contains_key("creationTimestamp")
    {
        return None;
    }
    if let Some(fw) = &s.firmware {
        let stored = vm.firmware()?;
        if stored.uuid.is_none() || (fw.serial.is_some() && stored.serial.is_none()) {
            return None;
        }
    }
    // Last in `metadata` (its flattened map of other fields is serialized last), where the
    // tree's inserts put them.
    let extra = &mut meta.extra;
    extra.insert(
        "resourceVersion".into(),
        Value::String(snapshot.position.0.to_string()),
    );
    if let Some(created) = snapshot.created_at_ns {
        extra.insert("creationTimestamp".into(), Value::String(rfc3339(created)));
    }
    let json = serde_json::to_string(&VirtualMachineView::of(vm, &meta, Some(status))).ok()?;
    Some(vm_rendered(s, snapshot, json))
}

/// A VM rendered from its template: `Some(answer)`, or `None` when there is no usable
/// template (the caller renders through the JSON tree instead).
fn render_vm_json(snapshot: &Snapshot, s: &VmState, status: &VmStatus) -> Option<ObjectJson> {
    let template = snapshot.vm_json.template(s, snapshot.created_at_ns)?;
    let (text, holes) = template.text.as_ref()?;
    let mut json = Vec::with_capacity(text.len() + 1024);
    let mut at = 0;
    for (offset, hole) in holes {
        json.extend_from_slice(text.get(at..*offset)?.as_bytes());
        at = *offset;
        match hole {
            // Compact JSON, as serializing the whole object writes it in place.
            Hole::Status => serde_json::to_writer(&mut json, status).ok()?,
            // A string of digits: nothing to escape.
            Hole::ResourceVersion => write!(json, "\"{}\"", snapshot.position.0).ok()?,
        }
    }
    json.extend_from_slice(text.get(at..)?.as_bytes());
    // UTF-8 pieces (the template's text cut at ASCII, serde_json's output, digits).
    let json = String::from_utf8(json).ok()?;
    Some(vm_rendered(s, snapshot, json))
}

/// Where a [`VmTemplate`]'s text takes a value of the state being rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hole {
    /// `status`: the state's derived status.
    Status,
    /// `metadata.resourceVersion`: the position of the state's last event.
    ResourceVersion,
}

/// Placeholders the template is serialized with, then cut out. As JSON text they hold
/// escaped NULs and no `:`, so they occur only where the placeholders were put, unless a
/// stored string holds the very same text: then a placeholder is counted more than once and
/// the object is not templated.
const STATUS_MARK: &str = "\u{0}vmplane-status\u{0}";
const RESOURCE_VERSION_MARK: &str = "\u{0}vmplane-resource-version\u{0}";

/// A VM's stored object as JSON text, ready for a state's status and resourceVersion: what
/// [`render_vm`] builds with those two left out, serialized once per stored object (kept with
/// the snapshot's [`crate::model::VmJson`], shared by the states folded from one snapshot).
/// It also depends on the creation time and the effective firmware identity, which it
/// records and is checked against before use.
#[derive(Debug, Clone)]
pub(crate) struct VmTemplate {
    created_at_ns: Option<i64>,
    firmware: Option<(uuid::Uuid, Option<String>)>,
    /// The text without its holes and where they go (byte offsets, ascending); `None` if the
    /// object cannot be templated.
    text: Option<(String, Vec<(usize, Hole)>)>,
}

impl VmTemplate {
    /// `object` (a VM's stored object with its `status` slot, as [`crate::model::VmJson`]
    /// keeps it) made into the template for `s`, created at `created_at_ns`.
    pub(crate) fn new(mut object: Value, s: &VmState, created_at_ns: Option<i64>) -> VmTemplate {
        let text = (|| {
            let slot = object.as_object_mut()?.get_mut("status")?;
            *slot = Value::String(STATUS_MARK.to_owned());
            let has_meta = set_meta(
                &mut object,
                Value::String(RESOURCE_VERSION_MARK.to_owned()),
                created_at_ns,
            );
            fill_firmware(&mut object, s);
            cut_holes(
                object.to_string(),
                &[
                    (Hole::Status, STATUS_MARK, 1),
                    (
                        Hole::ResourceVersion,
                        RESOURCE_VERSION_MARK,
                        usize::from(has_meta),
                    ),
                ],
            )
        })();
        VmTemplate {
            created_at_ns,
            firmware: firmware_key(s),
            text,
        }
    }

    /// Whether it is the template of `s` created at `created_at_ns` (its stored object is
    /// checked by the caller).
    pub(crate) fn fits(&self, s: &VmState, created_at_ns: Option<i64>) -> bool {
        self.created_at_ns == created_at_ns
            && self
                .firmware
                .as_ref()
                .map(|(u, serial)| (*u, serial.as_deref()))
                == s.firmware.as_ref().map(|f| (f.uuid, f.serial.as_deref()))
    }
}

fn firmware_key(s: &VmState) -> Option<(uuid::Uuid, Option<String>)> {
    s.firmware.as_ref().map(|f| (f.uuid, f.serial.clone()))
}

/// `text` with each `(hole, mark, count)`'s mark (as a JSON string) cut out, if it occurs
/// exactly `count` times and no two occurrences overlap.
fn cut_holes(text: String, marks: &[(Hole, &str, usize)]) -> Option<(String, Vec<(usize, Hole)>)> {
    let mut found = Vec::new();
    for (hole, mark, count) in marks {
        let needle = Value::String((*mark).to_owned()).to_string();
        let at: Vec<usize> = text.match_indices(&needle).map(|(i, _)| i).collect();
        if at.len() != *count {
            return None;
        }
        found.extend(at.into_iter().map(|i| (i, i + needle.len(), *hole)));
    }
    found.sort_unstable_by_key(|f| f.0);
    let mut out = String::with_capacity(text.len());
    let mut holes = Vec::with_capacity(found.len());
    let mut at = 0;
    for (start, end, hole) in found {
        out.push_str(text.get(at..start)?);
        holes.push((out.len(), hole));
        at = end;
    }
    out.push_str(text.get(at..)?);
    Some((out, holes))
}

/// A stored object (`manifest`, rendered by its aggregate) with the log's metadata.
fn render_object(
    snapshot: &Snapshot,
    s: &vmplane_core::ObjectState,
    manifest: vmplane_core::types::Manifest,
) -> Option<ObjectView> {
    let mut object = manifest.to_value();
    finish_meta(&mut object, snapshot);
    Some(ObjectView {
        kind: manifest.kind(),
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        uid: s.uid.map(|u| u.to_string()),
        generation: s.generation,
        resource_version: snapshot.position,
        object,
    })
}

fn finish_meta(object: &mut Value, snapshot: &Snapshot) {
    set_meta(
        object,
        Value::String(snapshot.position.0.to_string()),
        snapshot.created_at_ns,
    );
}

/// Writes `metadata.resourceVersion` and `metadata.creationTimestamp`; whether there was a
/// `metadata` object to write them in.
fn set_meta(object: &mut Value, resource_version: Value, created_at_ns: Option<i64>) -> bool {
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return false;
    };
    meta.insert("resourceVersion".into(), resource_version);
    if let Some(created) = created_at_ns {
        meta.insert("creationTimestamp".into(), Value::String(rfc3339(created)));
    }
    true
}

fn render_vm(
    snapshot: &Snapshot,
    s: &VmState,
    features: &Features,
    now_ms: i64,
) -> Option<ObjectView> {
    // `lifecycle::render` serialized: the stored object (serialized once per object, uid and
    // generation, and shared by the states folded from one snapshot) with this state's status
    // put in its slot.
    let status = lifecycle::render_status(s, features, now_ms)?;
    let mut object = snapshot.vm_json.object(s)?;
    let slot = object.as_object_mut()?.get_mut("status")?;
    *slot = status;
    finish_meta(&mut object, snapshot);
    fill_firmware(&mut object, s);
    Some(vm_rendered(s, snapshot, object))
}

/// A VM's metadata at `snapshot` with its rendered `object` (tree or text).
fn vm_rendered<B>(s: &VmState, snapshot: &Snapshot, object: B) -> Rendered<B> {
    Rendered {
        kind: Kind::VirtualMachine,
        namespace: Some(s.namespace.clone()),
        name: s.name.clone(),
        uid: s.uid.map(|u| u.to_string()),
        generation: s.generation,
        resource_version: snapshot.position,
        object,
    }
}

/// The effective firmware identity is in the stored spec (semantics §1 row 14); fills it if an
/// older event left it out, never overwrites it.
fn fill_firmware(object: &mut Value, s: &VmState) {
    if let Some(fw) = &s.firmware {
        let firmware = path_mut(object, &["spec", "template", "spec", "domain", "firmware"]);
        if let Some(firmware) = firmware {
            if !firmware.contains_key("uuid") {
                firmware.insert("uuid".into(), Value::String(fw.uuid.to_string()));
            }
            if let Some(serial) = &fw.serial
                && !firmware.contains_key("serial")
            {
                firmware.insert("serial".into(), Value::String(serial.clone()));
            }
        }
    }
}

/// The object at `keys` under `doc`, made (empty) where missing. Present keys are looked up
/// without allocating one (`Map::entry` takes an owned key).
fn path_mut<'a>(doc: &'a mut Value, keys: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut node = doc;
    for key in keys {
        let map = node.as_object_mut()?;
        if !map.contains_key(*key) {
            map.insert((*key).to_owned(), Value::Object(Map::new()));
        }
        node = map.get_mut(*key)?;
    }
    node.as_object_mut()
}

/// The VMI of a VM's current run: [`vmplane_core::lifecycle::render_vmi`] (what the
/// hypervisor runs) with the server's metadata.
fn render_vm_vmi(snapshot: &Snapshot, s: &VmState) -> Option<ObjectView> {
    let run = s.run.vmi.as_ref()?;
    let vmi = vmplane_core::lifecycle::render_vmi(s)?;
    let mut object = serde_json::to_value(&vmi).ok()?;
    let meta = object.get_mut("metadata")?.as_object_mut()?;
    meta.insert("generation".into(), json!(1));
    // The VMI's own last event, not the VM's (a spec edit of the VM does not change it).
    meta.insert(
        "resourceVersion".into(),
        json!(snapshot.vmi_position.0.to_string()),
    );
    meta.insert(
        "creationTimestamp".into(),
        json!(rfc3339(run.launched_at_ms.saturating_mul(1_000_000))),
    );
    meta.insert(
        "ownerReferences".into(),
        json!([{
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "name": s.name,
            "uid": s.uid.map(|u| u.to_string()),
            "controller": true,
            "blockOwnerDeletion": true,
        }]),
    );
    Some(ObjectView {
        kind: Kind::VirtualMachineInstance,
        namespace: Some(s.namespace.clone()),
        name: s.name.clone(),
        uid: Some(run.uid.to_string()),
        generation: 1,
        resource_version: snapshot.vmi_position,
        object,
    })
}

fn render_vmi(snapshot: &Snapshot, s: &VmiState, features: &Features) -> Option<ObjectView> {
    if !s.is_live() {
        return None;
    }
    let mut vmi = s.vmi.clone()?;
    vmi.metadata.uid = s.uid.map(|u| u.to_string());
    vmi.metadata.generation = Some(1);
    // Derived, like every status, by the rule of a VM's VMI (phase, node, reason, message, the
    // Ready condition); a Pending VMI that requests a disabled feature says so too.
    vmi.status = vmplane_core::lifecycle::standalone_vmi_status(s, features);
    let mut object = serde_json::to_value(&vmi).ok()?;
    finish_meta(&mut object, snapshot);
    Some(ObjectView {
        kind: Kind::VirtualMachineInstance,
        namespace: Some(s.namespace.clone()),
        name: s.name.clone(),
        uid: s.uid.map(|u| u.to_string()),
        generation: 1,
        resource_version: snapshot.position,
        object,
    })
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;
    use vmplane_core::event::{
        CreateOrigin, FirmwareOrigin, VmCreated, VmSpecEdited, VmiLaunched, VmiPhase,
        VmiPhaseObserved,
    };
    use vmplane_core::{Event, encode};
    use vmplane_store::{RecordedEventRef, Timestamp};

    use super::*;

    /// A manifest with fields vmplane does not interpret at every level (top-level ones are
    /// serialized after `status`), a resourceVersion and no firmware serial.
    fn manifest(memory: u64) -> String {
        format!(
            r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"a","namespace":"ns","labels":{{"app":"x"}},"finalizers":["f"]}},"spec":{{"runStrategy":"Always","template":{{"spec":{{"domain":{{"memory":{{"guest":"{memory}Mi"}}}}}}}},"dataVolumeTemplates":[]}},"zExtra":{{"k":1}},"aExtra":"v"}}"#
        )
    }

    /// What `render_vm` gave before the stored object was shared: `lifecycle::render`
    /// serialized, then the log's metadata and the firmware identity.
    fn reference(snapshot: &Snapshot, s: &VmState, features: &Features, now_ms: i64) -> Value {
        let vm = lifecycle::render(s, features, now_ms).expect("live");
        let mut object = serde_json::to_value(&vm).expect("json");
        finish_meta(&mut object, snapshot);
        if let Some(fw) = &s.firmware
            && let Some(firmware) = path_mut(
                &mut object,
                &["spec", "template", "spec", "domain", "firmware"],
            )
        {
            firmware
                .entry("uuid")
                .or_insert_with(|| Value::String(fw.uuid.to_string()));
            if let Some(serial) = &fw.serial {
                firmware
                    .entry("serial")
                    .or_insert_with(|| Value::String(serial.clone()));
            }
        }
        object
    }

    fn apply(snapshot: &mut Snapshot, event: &Event) {
        let encoded = encode(event);
        let revision = snapshot.state.revision() + 1;
        let hash = [0u8; 32];
        snapshot
            .apply(&RecordedEventRef {
                position: Position(revision * 10),
                stream: "vm/ns/a",
                revision,
                id: Uuid::from_u128(u128::from(revision)),
                recorded_at: Timestamp(1_700_000_000_000_000_000 + revision as i64),
                actor: "test",
                correlation_id: Uuid::from_u128(0),
                causation_id: None,
                event_type: encoded.type_name,
                schema_version: encoded.version,
                payload: &encoded.bytes,
                prev_hash: &hash,
                hash: &hash,
            })
            .expect("apply");
    }

    /// VM `ns/a` created from `manifest_json`, with firmware UUID 2 and `serial`.
    fn created(manifest_json: String, serial: Option<&str>) -> Event {
        Event::VmCreated(VmCreated {
            uid: Uuid::from_u128(1),
            namespace: "ns".into(),
            name: "a".into(),
            origin: CreateOrigin::Apply,
            manifest_json,
            firmware_uuid: Uuid::from_u128(2),
            firmware_serial: serial.map(str::to_owned),
            firmware_origin: FirmwareOrigin::Generated,
        })
    }

    fn text(snapshot: &Snapshot, features: &Features) -> (String, String) {
        let AggState::Vm(s) = &snapshot.state else {
            panic!("a VM stream");
        };
        let now_ms = snapshot.recorded_at_ns / 1_000_000;
        let got = render(snapshot, Kind::VirtualMachine, features, now_ms).expect("rendered");
        let want = reference(snapshot, s, features, now_ms);
        // The text read gives the tree read's text, from its template.
        let json = render_json(snapshot, Kind::VirtualMachine, features, now_ms).expect("text");
        assert_eq!(json, got.clone().into_json());
        // So does a write's answer, serialized from the typed object (on a fresh memo: it
        // neither needs nor fills one).
        let fresh = Snapshot {
            vm_json: Default::default(),
            ..snapshot.clone()
        };
        let once = render_once_json(&fresh, Kind::VirtualMachine, features, now_ms).expect("text");
        assert_eq!(once, got.clone().into_json());
        // The basic view's fields are the rendered object's.
        let basic = header(&fresh, Kind::VirtualMachine).expect("a live VM");
        assert_eq!(basic.with_object(once.object.clone()), once);
        // Without the tree exactly when the stored spec holds the firmware identity (as every
        // create since it is stored there writes it).
        let stored =
            s.vm.as_ref()
                .and_then(|vm| vm.firmware())
                .is_some_and(|f| f.uuid.is_some() && f.serial.is_some());
        let status = lifecycle::vm_status(s, features, now_ms).expect("live");
        assert_eq!(
            render_vm_direct(&fresh, s, &status).is_some(),
            stored,
            "serialized without the tree"
        );
        assert_eq!(
            fresh.vm_json.filled(),
            !stored,
            "the memo is left for reads"
        );
        let template = snapshot
            .vm_json
            .template(s, snapshot.created_at_ns)
            .expect("a template");
        assert!(template.text.is_some(), "templated");
        // Compared as text: key order is part of the answer.
        (
            serde_json::to_string(&got.object).expect("text"),
            serde_json::to_string(&want).expect("text"),
        )
    }

    #[test]
    fn a_vm_renders_as_its_serialized_lifecycle_render_across_shared_and_new_objects() {
        let features = Features::defaults();
        let vmi = Uuid::from_u128(9);
        let mut snapshot = Snapshot::empty(Kind::VirtualMachine);
        apply(&mut snapshot, &created(manifest(128), Some("serial")));
        let (got, want) = text(&snapshot, &features);
        assert_eq!(got, want);
        assert!(got.contains(r#""zExtra""#) && got.contains(r#""status""#));
        apply(
            &mut snapshot,
            &Event::VmiLaunched(VmiLaunched {
                vmi_uid: vmi,
                vm_generation: 1,
                paused: false,
                at_ms: 1_700_000_000_000,
            }),
        );
        // States folded from one snapshot share its serialized object; each has its status.
        let base = snapshot.clone();
        for phase in [VmiPhase::Scheduled, VmiPhase::Running, VmiPhase::Failed] {
            let mut next = base.clone();
            apply(
                &mut next,
                &Event::VmiPhaseObserved(VmiPhaseObserved {
                    vmi_uid: vmi,
                    phase,
                    reason: None,
                    message: Some("m".into()),
                    at_ms: 1_700_000_000_001,
                }),
            );
            let (got, want) = text(&next, &features);
            assert_eq!(got, want, "{phase:?}");
            let (got, want) = text(&base, &features);
            assert_eq!(got, want);
        }
        // An edit changes the object and the generation: the next render shows the new one,
        // and the state it was folded from still shows the old one.
        let mut edited = base.clone();
        apply(
            &mut edited,
            &Event::VmSpecEdited(VmSpecEdited {
                manifest_json: manifest(256),
            }),
        );
        let (got, want) = text(&edited, &features);
        assert_eq!(got, want);
        assert!(got.contains("256Mi") && !got.contains("128Mi"));
        let (got, want) = text(&base, &features);
        assert_eq!(got, want);
        assert!(got.contains("128Mi"));
    }

    #[test]
    fn a_terminating_vm_renders_its_deletion_timestamp_every_way_and_its_state_before_none() {
        let features = Features::defaults();
        let vmi = Uuid::from_u128(9);
        let mut base = Snapshot::empty(Kind::VirtualMachine);
        apply(&mut base, &created(manifest(128), Some("serial")));
        apply(
            &mut base,
            &Event::VmiLaunched(VmiLaunched {
                vmi_uid: vmi,
                vm_generation: 1,
                paused: false,
                at_ms: 1_700_000_000_000,
            }),
        );
        // The state before is read first: its memo is made, and shared with the next.
        let (got, want) = text(&base, &features);
        assert_eq!(got, want);
        let mut going = base.clone();
        apply(
            &mut going,
            &Event::VmDeletionRequested(vmplane_core::event::VmDeletionRequested {
                uid: Uuid::from_u128(1),
                vmi_uid: vmi,
                at_ms: 1_700_000_003_000,
            }),
        );
        let (got, want) = text(&going, &features);
        assert_eq!(got, want);
        assert!(
            got.contains(r#""deletionTimestamp":"2023-11-14T22:13:23Z","resourceVersion""#),
            "{got}"
        );
        assert!(got.contains(r#""printableStatus":"Terminating""#), "{got}");
        let (got, want) = text(&base, &features);
        assert_eq!(got, want);
        assert!(!got.contains("deletionTimestamp"), "{got}");
        assert!(header(&going, Kind::VirtualMachine).is_some());
    }

    #[test]
    fn a_vm_whose_stored_spec_holds_its_firmware_renders_the_same_without_the_tree() {
        let features = Features::defaults();
        let mut snapshot = Snapshot::empty(Kind::VirtualMachine);
        let manifest = manifest(128).replace(
            r#""domain":{"#,
            r#""domain":{"firmware":{"uuid":"00000000-0000-0000-0000-000000000002","serial":"serial","bootloader":{"efi":{}}},"#,
        );
        apply(&mut snapshot, &created(manifest, Some("serial")));
        let (got, want) = text(&snapshot, &features);
        assert_eq!(got, want);
        assert!(got.contains(r#""resourceVersion":"10","creationTimestamp""#));
        // A state without a live object renders nothing, either way.
        let mut deleted = snapshot.clone();
        apply(
            &mut deleted,
            &Event::VmDeleted(vmplane_core::event::VmDeleted {
                uid: Uuid::from_u128(1),
            }),
        );
        for way in [render_json, render_once_json] {
            assert_eq!(way(&deleted, Kind::VirtualMachine, &features, 0), None);
        }
        assert_eq!(header(&deleted, Kind::VirtualMachine), None);
        // Nor is a VM's stream rendered as another kind's header.
        assert_eq!(header(&snapshot, Kind::VirtualMachineInstance), None);
    }

    #[test]
    fn an_object_holding_a_placeholder_s_text_is_rendered_through_its_tree() {
        let features = Features::defaults();
        for label in [STATUS_MARK, RESOURCE_VERSION_MARK] {
            let mut snapshot = Snapshot::empty(Kind::VirtualMachine);
            let manifest = manifest(128).replace(
                r#""finalizers":["f"]"#,
                &format!(
                    r#""finalizers":["f"],"annotations":{{"x":{}}}"#,
                    Value::String(label.to_owned())
                ),
            );
            apply(&mut snapshot, &created(manifest, None));
            let AggState::Vm(s) = &snapshot.state else {
                panic!("a VM stream");
            };
            let template = snapshot
                .vm_json
                .template(s, snapshot.created_at_ns)
                .expect("a template");
            assert!(template.text.is_none(), "{label:?} is not templated");
            let now_ms = snapshot.recorded_at_ns / 1_000_000;
            let tree = render(&snapshot, Kind::VirtualMachine, &features, now_ms).expect("tree");
            assert!(tree.object.to_string().contains("vmplane-"));
            let json = render_json(&snapshot, Kind::VirtualMachine, &features, now_ms);
            assert_eq!(json, Some(tree.into_json()));
        }
    }
}

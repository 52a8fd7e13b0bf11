//! Objects in KubeVirt's JSON shape (INTERFACE.md "JSON and YAML objects"): the stored object
//! as core renders it, plus what only the log knows — `resourceVersion` (the position of the
//! object's last event) and `creationTimestamp`.

use serde_json::{Map, Value, json};
use vmplane_core::features::Features;
use vmplane_core::types::Kind;
use vmplane_core::{VmState, VmiState, lifecycle};
use vmplane_store::Position;

use crate::model::{AggState, Snapshot, rfc3339};

/// One object as a reader sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectView {
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
    pub object: Value,
}

impl ObjectView {
    /// The object's `spec` (Null if it has none).
    #[must_use]
    pub fn spec(&self) -> &Value {
        self.object.get("spec").unwrap_or(&Value::Null)
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
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(
            "resourceVersion".into(),
            Value::String(snapshot.position.0.to_string()),
        );
        if let Some(created) = snapshot.created_at_ns {
            meta.insert("creationTimestamp".into(), Value::String(rfc3339(created)));
        }
    }
}

fn render_vm(
    snapshot: &Snapshot,
    s: &VmState,
    features: &Features,
    now_ms: i64,
) -> Option<ObjectView> {
    let vm = lifecycle::render(s, features, now_ms)?;
    let mut object = serde_json::to_value(&vm).ok()?;
    finish_meta(&mut object, snapshot);
    // The effective firmware identity is in the stored spec (semantics §1 row 14); fill it if
    // an older event left it out, never overwrite it.
    if let Some(fw) = &s.firmware {
        let firmware = path_mut(
            &mut object,
            &["spec", "template", "spec", "domain", "firmware"],
        );
        if let Some(firmware) = firmware {
            firmware
                .entry("uuid")
                .or_insert_with(|| Value::String(fw.uuid.to_string()));
            if let Some(serial) = &fw.serial {
                firmware
                    .entry("serial")
                    .or_insert_with(|| Value::String(serial.clone()));
            }
        }
    }
    Some(ObjectView {
        kind: Kind::VirtualMachine,
        namespace: Some(s.namespace.clone()),
        name: s.name.clone(),
        uid: s.uid.map(|u| u.to_string()),
        generation: s.generation,
        resource_version: snapshot.position,
        object,
    })
}

fn path_mut<'a>(doc: &'a mut Value, keys: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut node = doc;
    for key in keys {
        node = node
            .as_object_mut()?
            .entry(*key)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    node.as_object_mut()
}

/// The VMI of a VM's current run.
fn render_vm_vmi(snapshot: &Snapshot, s: &VmState) -> Option<ObjectView> {
    let run = s.run.vmi.as_ref()?;
    let vm_uid = s.uid.map(|u| u.to_string());
    let mut metadata = json!({
        "name": s.name,
        "namespace": s.namespace,
        "uid": run.uid.to_string(),
        "generation": 1,
        "resourceVersion": snapshot.position.0.to_string(),
        "creationTimestamp": rfc3339(run.launched_at_ms.saturating_mul(1_000_000)),
        "ownerReferences": [{
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "name": s.name,
            "uid": vm_uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    if let Some(labels) =
        s.vm.as_ref()
            .and_then(|vm| vm.spec.template.as_ref())
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
        && let Some(meta) = metadata.as_object_mut()
    {
        meta.insert("labels".into(), Value::Object(labels));
    }
    let spec = run
        .started
        .template_spec
        .as_ref()
        .and_then(|spec| serde_json::to_value(spec).ok())
        .unwrap_or(Value::Object(Map::new()));
    let mut status = Map::new();
    status.insert("phase".into(), json!(run.phase.as_str()));
    if let Some(node) = &run.node {
        status.insert("nodeName".into(), json!(node));
    }
    if let Some(reason) = &run.reason {
        status.insert("reason".into(), json!(reason));
    }
    if let Some(message) = &run.message {
        status.insert("message".into(), json!(message));
    }
    if let Some(fw) = &s.firmware {
        status.insert("firmwareUUIDOrigin".into(), json!(fw.origin.as_str()));
    }
    let object = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": metadata,
        "spec": spec,
        "status": status,
    });
    Some(ObjectView {
        kind: Kind::VirtualMachineInstance,
        namespace: Some(s.namespace.clone()),
        name: s.name.clone(),
        uid: Some(run.uid.to_string()),
        generation: 1,
        resource_version: snapshot.position,
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
    let mut status = Map::new();
    if let Some(phase) = s.phase {
        status.insert("phase".into(), json!(phase.as_str()));
    }
    if let Some(node) = &s.node {
        status.insert("nodeName".into(), json!(node));
    }
    if let Some(reason) = &s.reason {
        status.insert("reason".into(), json!(reason));
    }
    if let Some(fw) = &s.firmware {
        status.insert("firmwareUUIDOrigin".into(), json!(fw.origin.as_str()));
    }
    // Derived, like every status: a Pending VMI that requests a disabled feature says so.
    let conditions: Vec<Value> = vmplane_core::lifecycle::vmi_conditions(s, features)
        .iter()
        .map(vmplane_core::lifecycle::Condition::to_json)
        .collect();
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    vmi.status = Some(Value::Object(status));
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

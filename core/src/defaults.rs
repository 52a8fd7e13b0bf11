//! Defaulting (KubeVirt's mutating webhooks and VMI defaults), kept apart from validation.
//!
//! Pure functions that fill what the user left unset. They never judge: [`crate::validate`]
//! does that. The firmware UUID and serial are not here: they need `ctx` and are decided in
//! `decide` (see [`crate::firmware`]).

use serde_json::{Value, json};

use crate::types::{Disk, DiskTarget, Input, Interface, JsonMap, Network, VirtualMachine, VmiSpec};

/// Namespace used when a manifest names none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Architecture when neither the VM nor its preference chooses one.
pub const DEFAULT_ARCHITECTURE: &str = "amd64";
/// Machine type on amd64.
pub const DEFAULT_MACHINE_TYPE_AMD64: &str = "q35";
/// Bus of a disk that names none (after preferences).
pub const DEFAULT_DISK_BUS: &str = "virtio";
/// Model of an interface that names none (after preferences).
pub const DEFAULT_INTERFACE_MODEL: &str = "virtio";
/// Name of the automatically attached pod interface and network.
pub const DEFAULT_NETWORK_NAME: &str = "default";
/// Name of the automatically attached input device.
pub const DEFAULT_INPUT_NAME: &str = "default-0";

/// Makes an incoming VM manifest ready to store: drops server-managed metadata and status,
/// and fills the namespace.
pub fn normalize_vm(vm: &mut VirtualMachine) {
    vm.metadata.strip_server_fields();
    vm.status = None;
    if vm.metadata.namespace.is_none() {
        vm.metadata.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
    normalize_firmware_uuid(vm);
}

/// A firmware UUID written in upper case (or braced, or without hyphens) is stored in its
/// canonical form, the one vmplane records when it assigns or captures a UUID: the first
/// apply stores that form, and every later apply of the same file normalises to the same
/// text, so it changes nothing (no new generation). Text that is not a UUID is left for
/// [`crate::validate`] to refuse.
pub fn normalize_firmware_uuid(vm: &mut VirtualMachine) {
    let Some(fw) = vm
        .spec
        .template
        .as_mut()
        .and_then(|t| t.spec.as_mut())
        .and_then(|s| s.domain.firmware.as_mut())
    else {
        return;
    };
    if let Some(u) = fw.uuid.as_mut()
        && let Ok(parsed) = uuid::Uuid::parse_str(u)
    {
        let canonical = parsed.to_string();
        if *u != canonical {
            *u = canonical;
        }
    }
}

/// The same for any object's metadata (`namespaced` says whether to fill the namespace).
pub fn normalize_meta(meta: &mut crate::types::ObjectMeta, namespaced: bool) {
    meta.strip_server_fields();
    if namespaced && meta.namespace.is_none() {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
    if !namespaced {
        meta.namespace = None;
    }
}

/// The devices KubeVirt's expand adds before instancetype and preference are applied: a disk
/// (device `disk`) for every volume that has none, a `disk` device for every disk that names
/// no device, and the pod interface and network when nothing is attached and
/// `autoattachPodInterface` is not false.
pub fn attach_default_devices(spec: &mut VmiSpec) {
    let volume_names: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    let networks_empty = spec.networks.as_ref().is_none_or(Vec::is_empty);
    let devices = spec.domain.devices_mut();
    let disks = devices.disks.get_or_insert_with(Vec::new);
    for name in &volume_names {
        if !disks.iter().any(|d| &d.name == name) {
            disks.push(Disk {
                name: name.clone(),
                ..Default::default()
            });
        }
    }
    for d in disks.iter_mut() {
        if d.disk.is_none()
            && d.cdrom.is_none()
            && d.lun.is_none()
            && !d.extra.contains_key("filesystem")
        {
            d.disk = Some(DiskTarget::default());
        }
    }
    if disks.is_empty() {
        devices.disks = None;
    }
    let autoattach_pod = devices.autoattach_pod_interface.unwrap_or(true);
    let ifaces_empty = devices.interfaces.as_ref().is_none_or(Vec::is_empty);
    if autoattach_pod && ifaces_empty && networks_empty {
        let mut extra = JsonMap::new();
        extra.insert("masquerade".into(), json!({}));
        devices.interfaces = Some(vec![Interface {
            name: DEFAULT_NETWORK_NAME.into(),
            extra,
            ..Default::default()
        }]);
        let mut net = JsonMap::new();
        net.insert("pod".into(), json!({}));
        spec.networks = Some(vec![Network {
            name: DEFAULT_NETWORK_NAME.into(),
            extra: net,
        }]);
    }
}

/// KubeVirt's VMI defaults, applied after instancetype and preference (expand): a bus for
/// every disk, a model for every interface, the machine type, the architecture, and the
/// default input device when `autoattachInputDevice` is true (its bus and type from the
/// preference when it has them).
pub fn vmi_spec(
    spec: &mut VmiSpec,
    preferred_input_bus: Option<&str>,
    preferred_input_type: Option<&str>,
) {
    let arch = spec
        .architecture
        .get_or_insert_with(|| DEFAULT_ARCHITECTURE.to_owned())
        .clone();
    let domain = &mut spec.domain;
    if arch == DEFAULT_ARCHITECTURE {
        let machine = domain.machine.get_or_insert_with(JsonMap::new);
        // An empty type is unset, as KubeVirt's defaults take it.
        let ty = machine.entry("type").or_insert(Value::Null);
        if ty.is_null() || ty.as_str() == Some("") {
            *ty = Value::String(DEFAULT_MACHINE_TYPE_AMD64.to_owned());
        }
    }
    let devices = domain.devices_mut();
    for d in devices.disks.iter_mut().flatten() {
        if let Some(t) = d.disk.as_mut() {
            t.bus.get_or_insert_with(|| DEFAULT_DISK_BUS.to_owned());
        }
    }
    for i in devices.interfaces.iter_mut().flatten() {
        // An empty model is unset (KubeVirt's default model too).
        if i.model.as_deref().is_none_or(str::is_empty) {
            i.model = Some(DEFAULT_INTERFACE_MODEL.to_owned());
        }
    }
    if devices.autoattach_input_device == Some(true)
        && devices.inputs.as_ref().is_none_or(Vec::is_empty)
    {
        devices.inputs = Some(vec![Input {
            name: DEFAULT_INPUT_NAME.into(),
            kind: Some(preferred_input_type.unwrap_or("tablet").to_owned()),
            bus: Some(preferred_input_bus.unwrap_or("usb").to_owned()),
            extra: JsonMap::new(),
        }]);
    }
}

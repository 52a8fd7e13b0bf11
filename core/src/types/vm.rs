use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{JsonMap, ObjectMeta};
use crate::quantity::Quantity;

/// `kubevirt.io/v1` VirtualMachine: the stored, desired definition of a VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachine {
    /// `kubevirt.io/v1`.
    pub api_version: String,
    /// `VirtualMachine`.
    pub kind: String,
    /// Name, namespace, labels, annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The desired state.
    #[serde(default)]
    pub spec: VirtualMachineSpec,
    /// Derived by vmplane (never stored); ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unknown top-level fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// A [`VirtualMachine`] to serialize with its own `metadata` and `status`, the rest borrowed
/// from the stored object: the same text as serializing a copy of it with those two replaced,
/// without copying its spec.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineView<'a, S: Serialize = Value> {
    /// The stored object's `apiVersion`.
    pub api_version: &'a str,
    /// The stored object's `kind`.
    pub kind: &'a str,
    /// The metadata to show.
    pub metadata: &'a ObjectMeta,
    /// The stored object's spec.
    pub spec: &'a VirtualMachineSpec,
    /// The status to show, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'a S>,
    /// The stored object's unknown top-level fields.
    #[serde(flatten)]
    pub extra: &'a JsonMap,
}

impl<'a, S: Serialize> VirtualMachineView<'a, S> {
    /// `vm` shown with `metadata` and `status` (a JSON value, or anything that serializes to
    /// one, such as [`crate::lifecycle::VmStatus`]).
    pub fn of(vm: &'a VirtualMachine, metadata: &'a ObjectMeta, status: Option<&'a S>) -> Self {
        VirtualMachineView {
            api_version: &vm.api_version,
            kind: &vm.kind,
            metadata,
            spec: &vm.spec,
            status,
            extra: &vm.extra,
        }
    }
}

/// `spec` of a VirtualMachine.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Deprecated: `true` ≡ `runStrategy: Always`, `false` ≡ `Halted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    /// `Always`, `RerunOnFailure`, `Manual`, `Halted`, `Once`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<String>,
    /// The instancetype reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instancetype: Option<Matcher>,
    /// The preference reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preference: Option<Matcher>,
    /// The VMI template. Boxed: inline it made up 2.4 of the VM's 3.4 KB, and reading a VM
    /// moves each value up through every struct that holds it (creates/s 1.03x).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Box<VmiTemplateSpec>>,
    /// Everything else (`dataVolumeTemplates`, `updateVolumesStrategy`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.instancetype` / `spec.preference`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Matcher {
    /// Name of the referenced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Kind; case-insensitive, singular or plural; defaults to the cluster kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A pinned revision (kept, not interpreted: vmplane captures at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// Infer from a volume's labels (not supported by vmplane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_from_volume: Option<String>,
    /// Unknown fields (`inferFromVolumeFailurePolicy`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.template`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmiTemplateSpec {
    /// Template metadata (labels, annotations for the VMI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// The VMI spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<VmiSpec>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `kubevirt.io/v1` VirtualMachineInstance: one run of a VM, or a standalone one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstance {
    /// `kubevirt.io/v1`.
    pub api_version: String,
    /// `VirtualMachineInstance`.
    pub kind: String,
    /// Name, namespace, labels, annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The VMI spec.
    #[serde(default)]
    pub spec: VmiSpec,
    /// Derived by vmplane; ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unknown top-level fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// VirtualMachineInstanceSpec (also `spec.template.spec` of a VM).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmiSpec {
    /// The virtual hardware.
    #[serde(default)]
    pub domain: DomainSpec,
    /// Node selector (string values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<JsonMap>,
    /// Scheduler name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Grace period for shutdown, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// CPU architecture (`amd64`, `arm64`, `s390x`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Hostname subdomain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    /// Volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
    /// Networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<Network>>,
    /// Unknown fields (`affinity`, `tolerations`, `accessCredentials`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `domain`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// CPU topology and model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Guest memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Resource requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    /// Firmware: UUID, serial, bootloader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Machine type (`{type: q35}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<JsonMap>,
    /// Features (`acpi`, `smm`, `hyperv`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<JsonMap>,
    /// Clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<JsonMap>,
    /// `shared` | `auto` | `supplementalPool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_threads_policy: Option<String>,
    /// IO threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_threads: Option<JsonMap>,
    /// Launch security (SEV, TDX, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_security: Option<Value>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `domain.cpu`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    /// Cores per socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Threads per core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// CPU model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Pin vCPUs to dedicated host CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    /// Isolate the emulator thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// NUMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<Value>,
    /// Realtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime: Option<Value>,
    /// Maximum sockets (CPU hotplug).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

impl Cpu {
    /// vCPUs = sockets × cores × threads (unset counts as 1); `None` if none is set.
    pub fn vcpus(&self) -> Option<u64> {
        if self.sockets.is_none() && self.cores.is_none() && self.threads.is_none() {
            return None;
        }
        let f = |v: Option<u32>| u64::from(v.unwrap_or(1).max(1));
        Some(f(self.sockets) * f(self.cores) * f(self.threads))
    }
}

/// `domain.memory`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Memory the guest sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<Quantity>,
    /// Hugepages (`{pageSize: 2Mi}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Value>,
    /// Maximum guest memory (memory hotplug).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_guest: Option<Quantity>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `domain.resources`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Requests (`memory`, `cpu`, …); values are quantities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<JsonMap>,
    /// Limits; values are quantities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<JsonMap>,
    /// Unknown fields (`overcommitGuestOverhead`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `domain.devices`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// Disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<Disk>>,
    /// Network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<Interface>>,
    /// Input devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<Input>>,
    /// Attach a default input device (tablet) when none is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_input_device: Option<bool>,
    /// Attach the pod network interface when none is listed (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    /// Random number generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<Value>,
    /// GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Value>,
    /// Host devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_devices: Option<Value>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// One disk.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Name; matches a volume.
    pub name: String,
    /// A disk device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    /// A CD-ROM device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdrom: Option<DiskTarget>,
    /// A LUN device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lun: Option<DiskTarget>,
    /// Unknown fields (`bootOrder`, `serial`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `disk` / `cdrom` / `lun` of a disk.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    /// `virtio`, `sata`, `scsi`, `usb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// One network interface.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name; matches a network.
    pub name: String,
    /// NIC model (`virtio`, `e1000e`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// Unknown fields (`masquerade`, `bridge`, `ports`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// One input device.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    /// Name.
    pub name: String,
    /// `tablet`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `usb` | `virtio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `domain.firmware`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    /// The SMBIOS system UUID (and libvirt domain UUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The SMBIOS serial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// `bios` / `efi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<JsonMap>,
    /// Unknown fields (`kernelBoot`, `acpi`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// One volume (only its name is interpreted).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Name; matched by a disk.
    pub name: String,
    /// The source (`containerDisk`, `cloudInitNoCloud`, `dataVolume`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// One network (only its name is interpreted).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Name; matched by an interface.
    pub name: String,
    /// The source (`pod`, `multus`).
    #[serde(flatten)]
    pub extra: JsonMap,
}

impl VirtualMachine {
    /// The template's VMI spec, if any.
    pub fn vmi_spec(&self) -> Option<&VmiSpec> {
        self.spec.template.as_ref()?.spec.as_ref()
    }

    /// The template's VMI spec, created empty if missing.
    pub fn vmi_spec_mut(&mut self) -> &mut VmiSpec {
        self.spec
            .template
            .get_or_insert_with(Default::default)
            .spec
            .get_or_insert_with(Default::default)
    }

    /// `spec.template.spec.domain.firmware`, if any.
    pub fn firmware(&self) -> Option<&Firmware> {
        self.vmi_spec()?.domain.firmware.as_ref()
    }

    /// `spec.template.spec.domain.firmware`, created empty if missing.
    pub fn firmware_mut(&mut self) -> &mut Firmware {
        self.vmi_spec_mut()
            .domain
            .firmware
            .get_or_insert_with(Default::default)
    }
}

impl DomainSpec {
    /// `devices`, created empty if missing.
    pub fn devices_mut(&mut self) -> &mut Devices {
        self.devices.get_or_insert_with(Default::default)
    }
    /// `cpu`, created empty if missing.
    pub fn cpu_mut(&mut self) -> &mut Cpu {
        self.cpu.get_or_insert_with(Default::default)
    }
    /// `memory`, created empty if missing.
    pub fn memory_mut(&mut self) -> &mut Memory {
        self.memory.get_or_insert_with(Default::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_serializes_as_the_object_with_its_metadata_and_status_replaced() {
        let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": "a", "namespace": "ns", "labels": {"x": "1"}, "finalizers": ["f"]},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}},
            "status": {"ignored": true},
            "zUnknown": {"kept": [1, 2]},
            "aUnknown": "also kept"
        }))
        .unwrap();
        let mut meta = vm.metadata.clone();
        meta.uid = Some("u".into());
        meta.generation = Some(3);
        meta.extra
            .insert("resourceVersion".into(), Value::String("9".into()));
        let status = serde_json::json!({"printableStatus": "Stopped"});
        for status in [None, Some(&status)] {
            let mut copy = vm.clone();
            copy.metadata = meta.clone();
            copy.status = status.cloned();
            assert_eq!(
                serde_json::to_string(&VirtualMachineView::of(&vm, &meta, status)).unwrap(),
                serde_json::to_string(&copy).unwrap()
            );
        }
    }
}

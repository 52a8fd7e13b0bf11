use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{JsonMap, ObjectMeta};
use crate::quantity::Quantity;

/// `instancetype.kubevirt.io/v1beta1` VirtualMachineInstancetype or
/// VirtualMachineClusterInstancetype (they share the spec; `kind` tells them apart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instancetype {
    /// `instancetype.kubevirt.io/v1beta1`.
    pub api_version: String,
    /// `VirtualMachineInstancetype` or `VirtualMachineClusterInstancetype`.
    pub kind: String,
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The resources and placement a VM gets.
    pub spec: InstancetypeSpec,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// VirtualMachineInstancetypeSpec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeSpec {
    /// vCPUs and CPU placement (required).
    pub cpu: InstancetypeCpu,
    /// Memory (required).
    pub memory: InstancetypeMemory,
    /// Node selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<JsonMap>,
    /// Scheduler name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Value>,
    /// Host devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_devices: Option<Value>,
    /// IO threads policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_threads_policy: Option<String>,
    /// IO threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_threads: Option<JsonMap>,
    /// Launch security (deprecated in KubeVirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_security: Option<Value>,
    /// Annotations applied to the VMI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<JsonMap>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.cpu` of an instancetype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeCpu {
    /// Number of vCPUs (required).
    pub guest: u32,
    /// CPU model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Dedicated CPU placement (note KubeVirt's spelling `dedicatedCPUPlacement` here).
    #[serde(
        default,
        rename = "dedicatedCPUPlacement",
        skip_serializing_if = "Option::is_none"
    )]
    pub dedicated_cpu_placement: Option<bool>,
    /// NUMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<Value>,
    /// Isolate the emulator thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// Realtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime: Option<Value>,
    /// Maximum sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.memory` of an instancetype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeMemory {
    /// Guest memory (required).
    pub guest: Quantity,
    /// Hugepages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Value>,
    /// Percent of guest memory not requested from the host (0..=100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overcommit_percent: Option<i64>,
    /// Maximum guest memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_guest: Option<Quantity>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `instancetype.kubevirt.io/v1beta1` VirtualMachinePreference or
/// VirtualMachineClusterPreference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preference {
    /// `instancetype.kubevirt.io/v1beta1`.
    pub api_version: String,
    /// `VirtualMachinePreference` or `VirtualMachineClusterPreference`.
    pub kind: String,
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the VM gets where it left a field unset, and what it must provide.
    #[serde(default)]
    pub spec: PreferenceSpec,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// VirtualMachinePreferenceSpec (typed where vmplane applies it).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceSpec {
    /// CPU preferences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<PreferenceCpu>,
    /// Device preferences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<PreferenceDevices>,
    /// Feature preferences: `preferredAcpi: {}` → `features.acpi: {}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<JsonMap>,
    /// Firmware preferences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<PreferenceFirmware>,
    /// Machine preferences (`preferredMachineType`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<JsonMap>,
    /// Clock preferences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<JsonMap>,
    /// Preferred architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_architecture: Option<String>,
    /// Preferred grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_termination_grace_period_seconds: Option<i64>,
    /// Preferred subdomain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_subdomain: Option<String>,
    /// Deprecated spread ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_spread_socket_to_core_ratio: Option<u32>,
    /// Annotations applied to the VMI (only keys the VM does not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<JsonMap>,
    /// What the VM must provide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<PreferenceRequirements>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.cpu` of a preference.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceCpu {
    /// `sockets` (default), `cores`, `threads`, `spread`, `any` (or the deprecated
    /// `preferSockets`…).
    #[serde(
        default,
        rename = "preferredCPUTopology",
        skip_serializing_if = "Option::is_none"
    )]
    pub preferred_cpu_topology: Option<String>,
    /// Options for `spread`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_options: Option<SpreadOptions>,
    /// Unknown fields (`preferredCPUFeatures`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spreadOptions`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpreadOptions {
    /// `SocketsCores` (default), `CoresThreads`, `SocketsCoresThreads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across: Option<String>,
    /// Ratio (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<u32>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.devices` of a preference.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceDevices {
    /// Bus for disks without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_disk_bus: Option<String>,
    /// Bus for CD-ROMs without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_cdrom_bus: Option<String>,
    /// Bus for LUNs without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_lun_bus: Option<String>,
    /// Model for interfaces without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_interface_model: Option<String>,
    /// `autoattachInputDevice` when the VM leaves it unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_autoattach_input_device: Option<bool>,
    /// `autoattachPodInterface` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_autoattach_pod_interface: Option<bool>,
    /// Bus for inputs without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_input_bus: Option<String>,
    /// Type for inputs without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_input_type: Option<String>,
    /// RNG device when the VM has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_rng: Option<Value>,
    /// TPM when the VM has none.
    #[serde(
        default,
        rename = "preferredTPM",
        skip_serializing_if = "Option::is_none"
    )]
    pub preferred_tpm: Option<Value>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.firmware` of a preference.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceFirmware {
    /// EFI (`{secureBoot: true}`) when the VM chose no bootloader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_efi: Option<JsonMap>,
    /// Deprecated: EFI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_efi: Option<bool>,
    /// Deprecated: secure boot with EFI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_secure_boot: Option<bool>,
    /// BIOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_bios: Option<bool>,
    /// BIOS serial console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_bios_serial: Option<bool>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec.requirements` of a preference.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceRequirements {
    /// Minimum vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuRequirement>,
    /// Minimum memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryRequirement>,
    /// Required architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `requirements.cpu`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuRequirement {
    /// Minimum vCPUs.
    pub guest: u32,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `requirements.memory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRequirement {
    /// Minimum memory.
    pub guest: Quantity,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

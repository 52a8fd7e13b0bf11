use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{JsonMap, ObjectMeta};

/// An object kept as written, with its spec as JSON: `KubeVirt` (cluster config, read by
/// [`crate::features`]), `VirtualMachineSnapshot`, `VirtualMachineRestore`,
/// `VirtualMachineClone` (their specs are read through typed views in
/// [`crate::aggregate::snapshot`], [`crate::aggregate::restore`], [`crate::aggregate::clone`]),
/// and the KubeVirt kinds it parses but does not manage (`VirtualMachinePool`,
/// `VirtualMachineInstanceReplicaSet`, `VirtualMachineInstanceMigration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenericObject {
    /// apiVersion.
    pub api_version: String,
    /// kind.
    pub kind: String,
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    /// Status (derived by vmplane; ignored on input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unknown top-level fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// A reference to another object (`{apiGroup, kind, name}`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    /// API group (`kubevirt.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Kind (`VirtualMachine`, `VirtualMachineSnapshot`).
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec` of a VirtualMachineSnapshot (typed part).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    /// The VM to snapshot.
    #[serde(default)]
    pub source: TypedLocalObjectReference,
    /// Unknown fields (`deletionPolicy`, `failureDeadline`).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec` of a VirtualMachineRestore (typed part).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpec {
    /// The VM to restore into (may be a new name).
    #[serde(default)]
    pub target: TypedLocalObjectReference,
    /// The snapshot to restore.
    #[serde(default)]
    pub virtual_machine_snapshot_name: String,
    /// Unknown fields (`patches`, `targetReadinessPolicy`, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

/// `spec` of a VirtualMachineClone (typed part).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloneSpec {
    /// The VM or snapshot to clone.
    #[serde(default)]
    pub source: TypedLocalObjectReference,
    /// The new VM (optional in KubeVirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TypedLocalObjectReference>,
    /// Interface name → new MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_mac_addresses: Option<JsonMap>,
    /// New SMBIOS serial.
    #[serde(
        default,
        rename = "newSMBiosSerial",
        skip_serializing_if = "Option::is_none"
    )]
    pub new_smbios_serial: Option<String>,
    /// Unknown fields (filters, patches, …).
    #[serde(flatten)]
    pub extra: JsonMap,
}

impl GenericObject {
    /// The spec parsed as `T` (e.g. [`SnapshotSpec`]); `None` if absent or not of that shape.
    pub fn typed_spec<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.spec.clone()?).ok()
    }
}

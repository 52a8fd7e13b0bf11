//! Firmware identity rules (semantics.md §1): the UUID and serial a guest sees.
//!
//! Rows 1–7 and 12–14 are decided by the VM and VMI aggregates; rows 8–11 (snapshot, restore,
//! clone) are the pure helpers here, called by [`crate::aggregate::snapshot`],
//! [`crate::aggregate::restore`] and [`crate::aggregate::clone`].

use std::collections::BTreeMap;

use uuid::{Uuid, uuid};

use crate::ctx::Ctx;
pub use crate::event::payload::FirmwareOrigin;
use crate::types::VirtualMachine;

/// KubeVirt's namespace for the legacy name-derived UUID (`magicUUID` in firmware.go).
pub const LEGACY_UUID_NAMESPACE: Uuid = uuid!("6a1a24a1-4061-4607-8bf4-a3963d0c5895");

/// The UUID KubeVirt gives a VM without a persisted one: v5 of the VM name alone (no
/// namespace), e.g. `testvm` → `5a9fc181-957e-5c32-9e5a-2de5e9673531`.
pub fn legacy_firmware_uuid(vm_name: &str) -> Uuid {
    Uuid::new_v5(&LEGACY_UUID_NAMESPACE, vm_name.as_bytes())
}

/// The uniqueness claim key for a firmware UUID: `firmware-uuid/<uuid>`.
pub fn claim_key(uuid: &Uuid) -> String {
    format!("firmware-uuid/{uuid}")
}

/// A VM's effective firmware identity and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwareIdentity {
    /// SMBIOS system UUID / libvirt domain UUID.
    pub uuid: Uuid,
    /// SMBIOS serial (`None` for VMs imported without one).
    pub serial: Option<String>,
    /// Where it came from (`status.firmwareUUIDOrigin`).
    pub origin: FirmwareOrigin,
}

/// Row 8: what a snapshot records of its VM's identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotIdentity {
    /// The UUID (absent in snapshots imported from KubeVirt before UUID persistence).
    pub uuid: Option<Uuid>,
    /// The serial.
    pub serial: Option<String>,
}

/// Row 8: the identity a snapshot of this VM records.
pub fn identity_for_snapshot(identity: &FirmwareIdentity) -> SnapshotIdentity {
    SnapshotIdentity {
        uuid: Some(identity.uuid),
        serial: identity.serial.clone(),
    }
}

/// The identity a restore or clone gives its target VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedIdentity {
    /// The firmware UUID.
    pub uuid: Uuid,
    /// The serial.
    pub serial: Option<String>,
    /// `Restored`, `Legacy` or `Cloned`, or `Generated` when a restore had to regenerate.
    pub origin: FirmwareOrigin,
    /// New MAC per interface name (empty = keep the source's MACs).
    pub macs: BTreeMap<String, String>,
    /// Whether the snapshot's identity was replaced because a live VM holds it (row 10);
    /// reported in the restore's status.
    pub regenerated: bool,
}

/// Rows 9 and 10: the identity for restoring `snapshot` (taken of VM `source_vm_name`) into VM
/// `target_vm_name`.
///
/// * Same VM (row 9): the snapshot's UUID and serial; a snapshot without a UUID gives the
///   legacy value of the VM name.
/// * New VM (row 10): the snapshot's UUID only if `snapshot_uuid_held_by_live_vm` is false
///   (disaster recovery of a deleted VM); otherwise a new UUID, serial and MACs.
///
/// `snapshot_uuid_held_by_live_vm` is a hint for choosing; the restore's decision still
/// carries a [`crate::Claim::Acquire`] for the UUID, so the store settles races atomically.
pub fn identity_for_restore(
    snapshot: &SnapshotIdentity,
    source_vm_name: &str,
    target_vm_name: &str,
    snapshot_uuid_held_by_live_vm: bool,
    interface_names: &[String],
    ctx: &mut Ctx,
) -> AssignedIdentity {
    let same_vm = source_vm_name == target_vm_name;
    if same_vm {
        return match snapshot.uuid {
            Some(uuid) => AssignedIdentity {
                uuid,
                serial: snapshot.serial.clone(),
                origin: FirmwareOrigin::Restored,
                macs: BTreeMap::new(),
                regenerated: false,
            },
            None => AssignedIdentity {
                uuid: legacy_firmware_uuid(target_vm_name),
                serial: snapshot.serial.clone(),
                origin: FirmwareOrigin::Legacy,
                macs: BTreeMap::new(),
                regenerated: false,
            },
        };
    }
    let snapshot_uuid = snapshot
        .uuid
        .unwrap_or_else(|| legacy_firmware_uuid(source_vm_name));
    if !snapshot_uuid_held_by_live_vm {
        return AssignedIdentity {
            uuid: snapshot_uuid,
            serial: snapshot.serial.clone(),
            origin: FirmwareOrigin::Restored,
            macs: BTreeMap::new(),
            regenerated: false,
        };
    }
    regenerated_identity(interface_names, ctx)
}

/// Row 10's fallback: a new random UUID, serial and MAC for every interface, origin
/// `Generated`, marked `regenerated` (reported in the restore's status). Also used when a
/// restore under the snapshot's own name finds its UUID held by another live VM.
pub fn regenerated_identity(interface_names: &[String], ctx: &mut Ctx) -> AssignedIdentity {
    let uuid = ctx.new_uuid_v4();
    let serial = Some(ctx.new_uuid_v4().to_string());
    let macs = interface_names
        .iter()
        .map(|n| (n.clone(), ctx.new_mac()))
        .collect();
    AssignedIdentity {
        uuid,
        serial,
        origin: FirmwareOrigin::Generated,
        macs,
        regenerated: true,
    }
}

/// Row 11: a clone always gets a new UUID, a new serial (the clone's `newSMBiosSerial` if
/// given) and new MACs (the clone's `newMacAddresses` where given).
pub fn identity_for_clone(
    interface_names: &[String],
    requested_serial: Option<&str>,
    requested_macs: &BTreeMap<String, String>,
    ctx: &mut Ctx,
) -> AssignedIdentity {
    let uuid = ctx.new_uuid_v4();
    let serial = Some(match requested_serial {
        Some(s) => s.to_owned(),
        None => ctx.new_uuid_v4().to_string(),
    });
    let macs = interface_names
        .iter()
        .map(|n| {
            (
                n.clone(),
                requested_macs
                    .get(n)
                    .cloned()
                    .unwrap_or_else(|| ctx.new_mac()),
            )
        })
        .collect();
    AssignedIdentity {
        uuid,
        serial,
        origin: FirmwareOrigin::Cloned,
        macs,
        regenerated: false,
    }
}

/// Writes an identity into a VM's template: firmware UUID, serial, and the MAC of each
/// interface named in `identity.macs`.
pub fn apply_identity(vm: &mut VirtualMachine, identity: &AssignedIdentity) {
    let fw = vm.firmware_mut();
    fw.uuid = Some(identity.uuid.to_string());
    fw.serial = identity.serial.clone();
    if identity.macs.is_empty() {
        return;
    }
    if let Some(ifaces) = vm.vmi_spec_mut().domain.devices_mut().interfaces.as_mut() {
        for iface in ifaces {
            if let Some(mac) = identity.macs.get(&iface.name) {
                iface.mac_address = Some(mac.clone());
            }
        }
    }
}

/// The interface names of a VM's template (for the MAC helpers).
pub fn interface_names(vm: &VirtualMachine) -> Vec<String> {
    vm.vmi_spec()
        .and_then(|s| s.domain.devices.as_ref())
        .and_then(|d| d.interfaces.as_ref())
        .map(|ifs| ifs.iter().map(|i| i.name.clone()).collect())
        .unwrap_or_default()
}

/// The firmware-UUID claims the decisions of a log attached to its events, derived from the
/// events alone, in log order: what a restore replays into the store's claim table to rebuild
/// it as it was. It follows the deciders' rules (`aggregate::vm`, `aggregate::vmi`): a create
/// acquires; an edit to another UUID acquires the new one and releases the old one, unless a
/// running VMI still has it (then the VMI's removal releases it); a delete releases the VM's
/// UUID and the one its VMI still had (a delete of a VM whose VMI is active only asks for it,
/// `VmDeletionRequested`, which holds on to both: the `VmDeleted` recorded with that VMI's
/// removal releases them).
#[derive(Debug, Default)]
pub struct ClaimReplay {
    streams: std::collections::HashMap<String, Held>,
}

/// What one stream holds while replaying.
#[derive(Debug, Default)]
struct Held {
    /// The object's effective UUID.
    current: Option<Uuid>,
    /// The UUID its current VMI was launched with, and whether that VMI is still active.
    run: Option<(Uuid, bool)>,
}

impl ClaimReplay {
    /// The claims decided with `event` of `stream`.
    pub fn claims(&mut self, stream: &str, event: &crate::event::Event) -> Vec<crate::Claim> {
        use crate::Claim;
        use crate::event::Event;
        let acquire = |uuid: &Uuid| Claim::Acquire {
            key: claim_key(uuid),
            owner: stream.to_owned(),
        };
        let release = |uuid: &Uuid| Claim::Release {
            key: claim_key(uuid),
            owner: stream.to_owned(),
        };
        match event {
            Event::VmCreated(e) => {
                let held = Held {
                    current: Some(e.firmware_uuid),
                    run: None,
                };
                self.streams.insert(stream.to_owned(), held);
                vec![acquire(&e.firmware_uuid)]
            }
            Event::VmiCreated(e) => {
                let held = Held {
                    current: Some(e.firmware_uuid),
                    run: None,
                };
                self.streams.insert(stream.to_owned(), held);
                vec![acquire(&e.firmware_uuid)]
            }
            Event::FirmwareUuidAssigned(e) => {
                let held = self.streams.entry(stream.to_owned()).or_default();
                match held.current.replace(e.uuid) {
                    Some(previous) if previous != e.uuid => {
                        let mut out = Vec::new();
                        if held.run != Some((previous, true)) {
                            out.push(release(&previous));
                        }
                        out.push(acquire(&e.uuid));
                        out
                    }
                    _ => Vec::new(),
                }
            }
            Event::VmiLaunched(_) => {
                if let Some(held) = self.streams.get_mut(stream) {
                    held.run = held.current.map(|u| (u, true));
                }
                Vec::new()
            }
            Event::VmiPhaseObserved(e) if e.phase.is_final() => {
                if let Some((_, active)) = self.streams.get_mut(stream).and_then(|h| h.run.as_mut())
                {
                    *active = false;
                }
                Vec::new()
            }
            Event::VmiRemoved(_) => match self.streams.get_mut(stream) {
                Some(held) => match held.run.take() {
                    Some((uuid, _)) if held.current != Some(uuid) => vec![release(&uuid)],
                    _ => Vec::new(),
                },
                None => Vec::new(),
            },
            Event::VmDeleted(_) | Event::VmiDeleted(_) => match self.streams.remove(stream) {
                Some(held) => {
                    let run = held
                        .run
                        .map(|(u, _)| u)
                        .filter(|u| held.current != Some(*u));
                    held.current.iter().chain(run.iter()).map(release).collect()
                }
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }
}

//! From a VMI run, as `core` describes it, to the [`DomainSpec`] the adapter renders. Pure: no
//! libvirt, no I/O, every problem reported with its KubeVirt field path.
//!
//! The input is the *expanded* VMI (instancetype, preference and KubeVirt's defaults applied),
//! as [`vmplane_core::lifecycle::render_vmi`] returns it for a VM's run and as a standalone
//! VMI is stored. What it reads, field by field:
//!
//! | KubeVirt field | domain |
//! |---|---|
//! | `metadata.name`, `metadata.namespace` | [`DomainName::for_instance`], metadata |
//! | `metadata.uid` | the VMI uid in vmplane's metadata (what adoption matches on) |
//! | `metadata.labels` (string values) | metadata labels |
//! | `spec.domain.firmware.uuid` / `.serial` | domain `<uuid>`, SMBIOS system UUID and serial |
//! | `spec.domain.firmware.bootloader` | `bios` (default) or `efi` (`secureBoot` defaults to true, as in KubeVirt) |
//! | `spec.domain.machine.type` | `<os><type machine=…>`: `q35` (the default, as in KubeVirt) or `pc-q35-<version>`; anything else refused |
//! | `spec.domain.cpu.{sockets,cores,threads}` | topology (unset parts count 1) |
//! | else `spec.domain.resources.requests.cpu` (else `limits.cpu`) | that many sockets, rounded up |
//! | `spec.domain.memory.guest`, else `resources.requests.memory` (else `limits.memory`) | memory |
//! | `spec.domain.devices.disks[*]` | `disk` (bus `virtio`/`sata`/`scsi`) or `cdrom` (bus default `sata`) |
//! | `spec.volumes[*].hostDisk.path` | the disk's source file |
//! | `spec.domain.devices.interfaces[*]` | model, `macAddress` or a MAC derived from the VMI uid |
//! | `spec.networks[*]` | `pod` → user-mode networking, `multus.networkName` → a libvirt network |
//!
//! **Disk contents are out of scope.** vmplane maps every disk a VMI asks for (name, bus,
//! device name, read-only), but it does not pull container disks or attach PVCs and
//! DataVolumes: such a disk has no source (`source: None`). libvirt refuses a disk device
//! without a source, so the renderer leaves those disks out of the domain; a CD-ROM without
//! one is an empty drive. Only a `hostDisk` volume names a file, which becomes the source. A
//! real guest therefore boots from nothing unless a host disk is given.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;
use uuid::Uuid;
use vmplane_core::quantity::Quantity;
use vmplane_core::types::{JsonMap, VirtualMachineInstance, VmiSpec};
use vmplane_core::{VmState, VmiState};

use crate::error::{SpecError, SpecProblem};
use crate::spec::{
    CpuTopology, Disk, DiskBus, DiskDevice, DiskFormat, DomainName, DomainSpec, Firmware,
    InstanceMetadata, Interface, InterfaceSource, MACHINE_TYPE_DEFAULT, MacAddress, NicModel,
    VirtType,
};

/// KubeVirt's default `terminationGracePeriodSeconds` (`DefaultGracePeriodSeconds`).
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: u64 = 30;

/// The UUID namespace of derived MAC addresses (a v5 UUID of `<vmi uid>/<interface name>`).
const MAC_UUID_NAMESPACE: Uuid = Uuid::from_u128(0x8c1d_53a0_6e2f_4a7b_b5d4_2f90_1c3e_77a1);

/// What the node decides rather than the VMI: the libvirt domain type and the emulator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainDefaults {
    /// `qemu` (TCG, portable) or `kvm`.
    pub virt_type: VirtType,
    /// The emulator binary, when QEMU is not where libvirt looks by default.
    pub emulator: Option<PathBuf>,
}

/// The domain of a VM's current VMI run (`None` when the VM has no VMI).
pub fn vm_domain_spec(
    state: &VmState,
    defaults: &DomainDefaults,
) -> Option<Result<DomainSpec, SpecError>> {
    let vmi = vmplane_core::lifecycle::render_vmi(state)?;
    Some(domain_spec(&vmi, defaults))
}

/// The domain of a standalone VMI (`None` when its stream holds no VMI object).
pub fn standalone_domain_spec(
    state: &VmiState,
    defaults: &DomainDefaults,
) -> Option<Result<DomainSpec, SpecError>> {
    let mut vmi = state.vmi.clone()?;
    vmi.metadata.name = Some(state.name.clone());
    vmi.metadata.namespace = Some(state.namespace.clone());
    vmi.metadata.uid = state.uid.map(|u| u.to_string());
    if let Some(fw) = &state.firmware {
        let f = vmi
            .spec
            .domain
            .firmware
            .get_or_insert_with(Default::default);
        f.uuid.get_or_insert_with(|| fw.uuid.to_string());
    }
    Some(domain_spec(&vmi, defaults))
}

/// The grace period of a graceful stop: `terminationGracePeriodSeconds`, else KubeVirt's
/// default; negative values count as 0.
pub fn grace_period_seconds(spec: &VmiSpec) -> u64 {
    spec.termination_grace_period_seconds
        .map_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS, |s| {
            u64::try_from(s).unwrap_or(0)
        })
}

/// Maps an expanded VMI to a domain, collecting every problem with its field path.
pub fn domain_spec(
    vmi: &VirtualMachineInstance,
    defaults: &DomainDefaults,
) -> Result<DomainSpec, SpecError> {
    let mut problems = Vec::new();
    let name = required_text(&mut problems, "metadata.name", vmi.metadata.name.as_deref());
    let namespace = required_text(
        &mut problems,
        "metadata.namespace",
        vmi.metadata.namespace.as_deref(),
    );
    let vmi_uid = parse_uuid(&mut problems, "metadata.uid", vmi.metadata.uid.as_deref());
    let spec = &vmi.spec;
    let domain = &spec.domain;
    let firmware = domain.firmware.as_ref();
    let firmware_uuid = parse_uuid(
        &mut problems,
        "spec.domain.firmware.uuid",
        firmware.and_then(|f| f.uuid.as_deref()),
    );
    let serial = firmware.and_then(|f| f.serial.clone());
    let boot = bootloader(&mut problems, firmware.and_then(|f| f.bootloader.as_ref()));
    let machine = machine_type(&mut problems, domain.machine.as_ref());
    let cpu = topology(&mut problems, spec);
    let memory_bytes = memory(&mut problems, spec);
    let disks = disks(&mut problems, spec);
    let interfaces = interfaces(&mut problems, spec, vmi_uid.unwrap_or_default());
    let node_selector = node_selector(&mut problems, spec);
    let labels: BTreeMap<String, String> = vmi
        .metadata
        .labels
        .iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
        .collect();

    let (Some(name), Some(namespace), Some(vmi_uid), Some(firmware_uuid)) =
        (name, namespace, vmi_uid, firmware_uuid)
    else {
        return Err(SpecError { problems });
    };
    if !problems.is_empty() {
        return Err(SpecError { problems });
    }
    let out = DomainSpec {
        name: DomainName::for_instance(&namespace, &name),
        firmware_uuid,
        serial,
        virt_type: defaults.virt_type,
        emulator: defaults.emulator.clone(),
        cpu,
        memory_bytes,
        machine,
        firmware: boot,
        disks,
        interfaces,
        metadata: InstanceMetadata {
            name,
            namespace,
            vmi_uid,
            labels,
        },
        node_selector,
    };
    // What is left is what the renderer refuses beyond the fields above (sizes, characters):
    // name the domain field under the VMI's `spec.domain`.
    out.validate().map_err(|e| SpecError {
        problems: e
            .problems
            .into_iter()
            .map(|p| SpecProblem::new(domain_field_path(&p.field), p.message))
            .collect(),
    })?;
    Ok(out)
}

/// `spec.domain.machine.type`: a Q35 machine ([`crate::spec::machine_type_problem`]); none
/// given is KubeVirt's default, `q35`.
fn machine_type(problems: &mut Vec<SpecProblem>, machine: Option<&JsonMap>) -> String {
    const FIELD: &str = "spec.domain.machine.type";
    match machine.and_then(|m| m.get("type")) {
        None | Some(Value::Null) => MACHINE_TYPE_DEFAULT.to_owned(),
        Some(Value::String(machine)) => {
            if let Some(problem) = crate::spec::machine_type_problem(machine) {
                problems.push(SpecProblem::new(FIELD, problem));
            }
            machine.clone()
        }
        Some(other) => {
            problems.push(SpecProblem::new(
                FIELD,
                format!("must be a string, not {other}"),
            ));
            MACHINE_TYPE_DEFAULT.to_owned()
        }
    }
}

/// `spec.nodeSelector`: label values must be strings, as in Kubernetes.
fn node_selector(problems: &mut Vec<SpecProblem>, spec: &VmiSpec) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in spec.node_selector.iter().flatten() {
        match value.as_str() {
            Some(v) => {
                out.insert(key.clone(), v.to_owned());
            }
            None => problems.push(SpecProblem::new(
                format!("spec.nodeSelector.{key}"),
                format!("must be a string, not {value}"),
            )),
        }
    }
    out
}

/// A deterministic MAC for interface `name` of VMI `vmi_uid`: locally administered (`x2`),
/// unicast, the same every time this VMI is defined and different for every run.
pub fn derived_mac(vmi_uid: Uuid, name: &str) -> MacAddress {
    let key = format!("{vmi_uid}/{name}");
    let b = Uuid::new_v5(&MAC_UUID_NAMESPACE, key.as_bytes()).into_bytes();
    MacAddress([(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]])
}

/// Where a [`DomainSpec`] field comes from in the VMI, for problems found by
/// [`DomainSpec::validate`] after mapping.
fn domain_field_path(field: &str) -> String {
    if field.starts_with("cpu") {
        "spec.domain.cpu".to_owned()
    } else if field == "memory_bytes" {
        "spec.domain.memory.guest".to_owned()
    } else if field == "serial" {
        "spec.domain.firmware.serial".to_owned()
    } else if field == "machine" {
        "spec.domain.machine.type".to_owned()
    } else if let Some(rest) = field.strip_prefix("disks") {
        format!(
            "spec.domain.devices.disks{}",
            rest.split('.').next().unwrap_or("")
        )
    } else if let Some(rest) = field.strip_prefix("interfaces") {
        format!(
            "spec.domain.devices.interfaces{}",
            rest.split('.').next().unwrap_or("")
        )
    } else if let Some(rest) = field.strip_prefix("metadata.") {
        format!("metadata.{rest}")
    } else {
        format!("spec.domain ({field})")
    }
}

fn required_text(problems: &mut Vec<SpecProblem>, field: &str, v: Option<&str>) -> Option<String> {
    match v {
        Some(s) if !s.is_empty() => Some(s.to_owned()),
        _ => {
            problems.push(SpecProblem::new(field, "is required"));
            None
        }
    }
}

fn parse_uuid(problems: &mut Vec<SpecProblem>, field: &str, v: Option<&str>) -> Option<Uuid> {
    match v.map(Uuid::parse_str) {
        Some(Ok(u)) => Some(u),
        Some(Err(_)) => {
            problems.push(SpecProblem::new(
                field,
                format!("{:?} is not a UUID", v.unwrap_or_default()),
            ));
            None
        }
        None => {
            problems.push(SpecProblem::new(field, "is required"));
            None
        }
    }
}

fn bootloader(problems: &mut Vec<SpecProblem>, b: Option<&JsonMap>) -> Firmware {
    let Some(b) = b else {
        return Firmware::Bios;
    };
    match (b.get("bios"), b.get("efi")) {
        (Some(_), Some(_)) => {
            problems.push(SpecProblem::new(
                "spec.domain.firmware.bootloader",
                "bios and efi are mutually exclusive",
            ));
            Firmware::Bios
        }
        (_, Some(efi)) => match efi.get("secureBoot") {
            None | Some(Value::Null) => Firmware::Efi { secure_boot: true },
            Some(Value::Bool(secure_boot)) => Firmware::Efi {
                secure_boot: *secure_boot,
            },
            Some(other) => {
                problems.push(SpecProblem::new(
                    "spec.domain.firmware.bootloader.efi.secureBoot",
                    format!("{other} is not a boolean"),
                ));
                Firmware::Bios
            }
        },
        _ => Firmware::Bios,
    }
}

/// A quantity from `requests` (else `limits`) of `domain.resources`, with its field path.
fn resource(spec: &VmiSpec, key: &str) -> Option<(String, Value)> {
    let resources = spec.domain.resources.as_ref()?;
    for (which, map) in [
        ("requests", resources.requests.as_ref()),
        ("limits", resources.limits.as_ref()),
    ] {
        if let Some(v) = map.and_then(|m| m.get(key)) {
            return Some((format!("spec.domain.resources.{which}.{key}"), v.clone()));
        }
    }
    None
}

fn quantity_units(problems: &mut Vec<SpecProblem>, field: &str, v: Value) -> Option<u64> {
    match serde_json::from_value::<Quantity>(v) {
        Ok(q) => match u64::try_from(q.units_ceil()) {
            Ok(n) if n > 0 => Some(n),
            _ => {
                problems.push(SpecProblem::new(
                    field,
                    format!("{q} must be a positive quantity"),
                ));
                None
            }
        },
        Err(e) => {
            problems.push(SpecProblem::new(field, e.to_string()));
            None
        }
    }
}

fn topology(problems: &mut Vec<SpecProblem>, spec: &VmiSpec) -> CpuTopology {
    if let Some(cpu) = spec
        .domain
        .cpu
        .as_ref()
        .filter(|c| c.sockets.is_some() || c.cores.is_some() || c.threads.is_some())
    {
        let mut part = |field: &str, v: Option<u32>| match v {
            None => 1,
            Some(0) => {
                problems.push(SpecProblem::new(field, "must be at least 1"));
                1
            }
            Some(n) => n,
        };
        return CpuTopology {
            sockets: part("spec.domain.cpu.sockets", cpu.sockets),
            cores: part("spec.domain.cpu.cores", cpu.cores),
            threads: part("spec.domain.cpu.threads", cpu.threads),
        };
    }
    let Some((field, v)) = resource(spec, "cpu") else {
        return CpuTopology::sockets(1);
    };
    let n = quantity_units(problems, &field, v).unwrap_or(1);
    match u32::try_from(n) {
        Ok(n) => CpuTopology::sockets(n),
        Err(_) => {
            problems.push(SpecProblem::new(field, format!("{n} vCPUs is too many")));
            CpuTopology::sockets(1)
        }
    }
}

fn memory(problems: &mut Vec<SpecProblem>, spec: &VmiSpec) -> u64 {
    let guest = spec.domain.memory.as_ref().and_then(|m| m.guest.as_ref());
    let (field, value) = match guest {
        Some(q) => (
            "spec.domain.memory.guest".to_owned(),
            serde_json::to_value(q).unwrap_or(Value::Null),
        ),
        None => match resource(spec, "memory") {
            Some(found) => found,
            None => {
                problems.push(SpecProblem::new(
                    "spec.domain.memory.guest",
                    "is required (or spec.domain.resources.requests.memory)",
                ));
                return 0;
            }
        },
    };
    quantity_units(problems, &field, value).unwrap_or(0)
}

fn disk_bus(
    problems: &mut Vec<SpecProblem>,
    field: &str,
    bus: Option<&str>,
    default: DiskBus,
) -> DiskBus {
    match bus {
        None => default,
        Some("virtio") => DiskBus::Virtio,
        Some("sata") => DiskBus::Sata,
        Some("scsi") => DiskBus::Scsi,
        Some(other) => {
            problems.push(SpecProblem::new(
                field,
                format!("bus {other:?} is not supported (virtio, sata or scsi)"),
            ));
            default
        }
    }
}

fn disks(problems: &mut Vec<SpecProblem>, spec: &VmiSpec) -> Vec<Disk> {
    let mut out = Vec::new();
    let mut next_vd = 0usize;
    let mut next_sd = 0usize;
    let listed = spec.domain.devices.as_ref().and_then(|d| d.disks.as_ref());
    for (i, disk) in listed.into_iter().flatten().enumerate() {
        let at = format!("spec.domain.devices.disks[{i}]");
        if disk.lun.is_some() {
            problems.push(SpecProblem::new(
                format!("{at}.lun"),
                "LUN disks are not supported",
            ));
            continue;
        }
        let (device, target, default_bus, field) = match (&disk.disk, &disk.cdrom) {
            (_, Some(cdrom)) => (
                DiskDevice::Cdrom,
                cdrom,
                DiskBus::Sata,
                format!("{at}.cdrom.bus"),
            ),
            (Some(d), None) => (
                DiskDevice::Disk,
                d,
                DiskBus::Virtio,
                format!("{at}.disk.bus"),
            ),
            (None, None) => {
                problems.push(SpecProblem::new(
                    at,
                    "only disk and cdrom devices are supported",
                ));
                continue;
            }
        };
        let bus = disk_bus(problems, &field, target.bus.as_deref(), default_bus);
        let (prefix, counter) = match bus {
            DiskBus::Virtio => ("vd", &mut next_vd),
            DiskBus::Sata | DiskBus::Scsi => ("sd", &mut next_sd),
        };
        let Some(target_dev) = device_name(prefix, *counter) else {
            problems.push(SpecProblem::new(at, "too many disks on one bus"));
            continue;
        };
        *counter += 1;
        let readonly = device == DiskDevice::Cdrom
            || target.extra.get("readonly").and_then(Value::as_bool) == Some(true);
        out.push(Disk {
            name: disk.name.clone(),
            target_dev,
            bus,
            device,
            source: host_disk_path(spec, &disk.name),
            format: DiskFormat::Raw,
            readonly,
        });
    }
    out
}

/// `vda`, `vdb`, … `vdz`, `vdaa`, … like the guest kernel names them.
fn device_name(prefix: &str, index: usize) -> Option<String> {
    let letters = b"abcdefghijklmnopqrstuvwxyz";
    let suffix = if index < 26 {
        vec![letters[index]]
    } else if index < 26 + 26 * 26 {
        let i = index - 26;
        vec![letters[i / 26], letters[i % 26]]
    } else {
        return None;
    };
    Some(format!("{prefix}{}", String::from_utf8_lossy(&suffix)))
}

/// The file of a `hostDisk` volume named `name`; other volume kinds have no file vmplane uses.
fn host_disk_path(spec: &VmiSpec, name: &str) -> Option<PathBuf> {
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)?
        .extra
        .get("hostDisk")?
        .get("path")?
        .as_str()
        .map(PathBuf::from)
}

fn interfaces(problems: &mut Vec<SpecProblem>, spec: &VmiSpec, vmi_uid: Uuid) -> Vec<Interface> {
    let mut out = Vec::new();
    let listed = spec
        .domain
        .devices
        .as_ref()
        .and_then(|d| d.interfaces.as_ref());
    for (i, nic) in listed.into_iter().flatten().enumerate() {
        let at = |f: &str| format!("spec.domain.devices.interfaces[{i}].{f}");
        let model = match nic.model.as_deref() {
            None | Some("virtio") => NicModel::Virtio,
            Some("e1000") => NicModel::E1000,
            Some("e1000e") => NicModel::E1000e,
            Some("rtl8139") => NicModel::Rtl8139,
            Some(other) => {
                problems.push(SpecProblem::new(
                    at("model"),
                    format!("{other:?} is not supported (virtio, e1000, e1000e or rtl8139)"),
                ));
                continue;
            }
        };
        let mac = match nic.mac_address.as_deref() {
            None => derived_mac(vmi_uid, &nic.name),
            Some(text) => match text.replace('-', ":").parse::<MacAddress>() {
                Ok(mac) => mac,
                Err(_) => {
                    problems.push(SpecProblem::new(
                        at("macAddress"),
                        format!("{text:?} is not a MAC address"),
                    ));
                    continue;
                }
            },
        };
        let network = spec.networks.iter().flatten().find(|n| n.name == nic.name);
        let source = match network {
            None => {
                problems.push(SpecProblem::new(
                    at("name"),
                    format!("no network named {:?} in spec.networks", nic.name),
                ));
                continue;
            }
            Some(n) => match n
                .extra
                .get("multus")
                .and_then(|m| m.get("networkName"))
                .and_then(Value::as_str)
            {
                Some(network) => InterfaceSource::Network(network.to_owned()),
                None => InterfaceSource::User,
            },
        };
        out.push(Interface {
            name: nic.name.clone(),
            model,
            mac,
            source,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmplane_core::types::{Manifest, parse_manifest};

    const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";
    const FW: &str = "5c1f6a2e-8d3b-4c7a-9e21-0b4d6f8a1c37";

    fn vmi(yaml_spec: &str) -> VirtualMachineInstance {
        let text = format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n\
             metadata: {{name: demo, namespace: default, uid: {UID}, labels: {{app: web}}}}\n\
             spec:\n{yaml_spec}"
        );
        match parse_manifest(text.as_bytes()) {
            Ok(Manifest::VirtualMachineInstance(v)) => *v,
            other => panic!("not a VMI: {other:?}"),
        }
    }

    fn map(yaml_spec: &str) -> Result<DomainSpec, SpecError> {
        domain_spec(&vmi(yaml_spec), &DomainDefaults::default())
    }

    fn fields(err: &SpecError) -> Vec<&str> {
        err.problems.iter().map(|p| p.field.as_str()).collect()
    }

    /// Audit: `get vmi` said `machine: type: q35` while the domain was `pc-i440fx-…`: the
    /// machine type was written only for secure boot.
    #[test]
    fn the_machine_type_is_the_domains_and_only_q35_machines_are_taken() {
        let domain = |machine: &str| {
            format!(
                "  domain:\n    firmware: {{uuid: {FW}}}\n    memory: {{guest: 64Mi}}\n{machine}"
            )
        };
        let q35 = map(&domain("    machine: {type: q35}\n")).expect("maps");
        assert_eq!(q35.machine, "q35");
        let xml = crate::xml::render_domain(&q35).expect("renders");
        assert!(
            xml.contains(r#"<type arch="x86_64" machine="q35">hvm</type>"#),
            "{xml}"
        );
        let versioned = map(&domain("    machine: {type: pc-q35-7.2}\n")).expect("maps");
        assert_eq!(versioned.machine, "pc-q35-7.2");
        // None given: KubeVirt's default.
        assert_eq!(map(&domain("")).expect("maps").machine, "q35");
        let refused = map(&domain("    machine: {type: pc-i440fx-7.2}\n")).expect_err("i440fx");
        assert_eq!(fields(&refused), ["spec.domain.machine.type"]);
        assert!(
            refused.problems[0]
                .message
                .contains("vmplane runs Q35 machines"),
            "{refused}"
        );
        let not_text = map(&domain("    machine: {type: 35}\n")).expect_err("a number");
        assert_eq!(fields(&not_text), ["spec.domain.machine.type"]);
    }

    #[test]
    fn a_full_vmi_maps_field_by_field() {
        let spec = map(&format!(
            r#"
  domain:
    cpu: {{sockets: 2, cores: 2}}
    memory: {{guest: 1Gi}}
    firmware: {{uuid: {FW}, serial: s-1, bootloader: {{efi: {{secureBoot: false}}}}}}
    devices:
      disks:
      - {{name: root, disk: {{bus: virtio}}}}
      - {{name: data, disk: {{bus: sata, readonly: true}}}}
      - {{name: cidata, cdrom: {{}}}}
      - {{name: scratch, disk: {{bus: scsi}}}}
      interfaces:
      - {{name: default, masquerade: {{}}, model: e1000e, macAddress: "02:00:00:aa:bb:cc"}}
      - {{name: blue, bridge: {{}}}}
  networks:
  - {{name: default, pod: {{}}}}
  - {{name: blue, multus: {{networkName: blue-net}}}}
  volumes:
  - {{name: root, containerDisk: {{image: quay.io/containerdisks/fedora}}}}
  - {{name: data, hostDisk: {{path: /var/lib/images/data.img, type: Disk}}}}
"#
        ))
        .expect("maps");
        assert_eq!(spec.name.as_str(), "vmplane_default_demo");
        assert_eq!(spec.firmware_uuid.to_string(), FW);
        assert_eq!(spec.serial.as_deref(), Some("s-1"));
        assert_eq!(spec.metadata.vmi_uid.to_string(), UID);
        assert_eq!(
            spec.metadata.labels.get("app").map(String::as_str),
            Some("web")
        );
        assert_eq!(
            spec.cpu,
            CpuTopology {
                sockets: 2,
                cores: 2,
                threads: 1
            }
        );
        assert_eq!(spec.memory_bytes, 1 << 30);
        assert_eq!(spec.firmware, Firmware::Efi { secure_boot: false });
        let disks: Vec<_> = spec
            .disks
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.target_dev.as_str(),
                    d.bus,
                    d.device,
                    d.readonly,
                )
            })
            .collect();
        assert_eq!(
            disks,
            [
                ("root", "vda", DiskBus::Virtio, DiskDevice::Disk, false),
                ("data", "sda", DiskBus::Sata, DiskDevice::Disk, true),
                ("cidata", "sdb", DiskBus::Sata, DiskDevice::Cdrom, true),
                ("scratch", "sdc", DiskBus::Scsi, DiskDevice::Disk, false),
            ]
        );
        // A container disk has no file (contents are out of scope); a host disk has one.
        assert_eq!(spec.disks[0].source, None);
        assert_eq!(
            spec.disks[1].source.as_deref(),
            Some(std::path::Path::new("/var/lib/images/data.img"))
        );
        assert_eq!(spec.interfaces[0].mac.to_string(), "02:00:00:aa:bb:cc");
        assert_eq!(spec.interfaces[0].model, NicModel::E1000e);
        assert_eq!(spec.interfaces[0].source, InterfaceSource::User);
        assert_eq!(
            spec.interfaces[1].source,
            InterfaceSource::Network("blue-net".into())
        );
        let uid = Uuid::parse_str(UID).expect("uuid");
        assert_eq!(spec.interfaces[1].mac, derived_mac(uid, "blue"));
        crate::xml::render_domain(&spec).expect("renders");
    }

    #[test]
    fn requests_give_vcpus_and_memory_without_topology() {
        let spec = map(&format!(
            "  domain:\n    firmware: {{uuid: {FW}}}\n    resources: {{requests: {{cpu: 1500m, memory: 64Mi}}}}\n"
        ))
        .expect("maps");
        assert_eq!(spec.cpu, CpuTopology::sockets(2));
        assert_eq!(spec.memory_bytes, 64 << 20);
        assert_eq!(spec.firmware, Firmware::Bios);
        // EFI without secureBoot is KubeVirt's default: secure boot on.
        let spec = map(&format!(
            "  domain:\n    memory: {{guest: 64Mi}}\n    firmware: {{uuid: {FW}, bootloader: {{efi: {{}}}}}}\n"
        ))
        .expect("maps");
        assert_eq!(spec.firmware, Firmware::Efi { secure_boot: true });
        assert_eq!(spec.cpu, CpuTopology::sockets(1));
    }

    #[test]
    fn derived_macs_are_stable_unicast_and_local() {
        let uid = Uuid::parse_str(UID).expect("uuid");
        let a = derived_mac(uid, "default");
        assert_eq!(a, derived_mac(uid, "default"));
        assert_ne!(a, derived_mac(uid, "other"));
        assert_ne!(a, derived_mac(Uuid::new_v4(), "default"));
        assert!(!a.is_multicast());
        assert_eq!(a.0[0] & 0x02, 0x02);
    }

    #[test]
    fn errors_name_every_field_path() {
        let err = map(r#"
  domain:
    cpu: {sockets: 0}
    firmware: {uuid: not-a-uuid}
    devices:
      disks:
      - {name: a, disk: {bus: usb}}
      - {name: b, lun: {}}
      interfaces:
      - {name: default, model: ne2k_pci}
      - {name: nonet}
      - {name: badmac, macAddress: "zz"}
  networks:
  - {name: default, pod: {}}
  - {name: badmac, pod: {}}
"#)
        .expect_err("invalid");
        assert_eq!(
            fields(&err),
            [
                "spec.domain.firmware.uuid",
                "spec.domain.cpu.sockets",
                "spec.domain.memory.guest",
                "spec.domain.devices.disks[0].disk.bus",
                "spec.domain.devices.disks[1].lun",
                "spec.domain.devices.interfaces[0].model",
                "spec.domain.devices.interfaces[1].name",
                "spec.domain.devices.interfaces[2].macAddress",
            ],
            "{err}"
        );
        let err = map(&format!(
            "  domain:\n    memory: {{guest: 64Mi}}\n    firmware: {{uuid: {FW}}}\n    cpu: {{sockets: 64, cores: 64}}\n"
        ))
        .expect_err("too many vCPUs");
        assert_eq!(fields(&err), ["spec.domain.cpu"], "{err}");
    }

    #[test]
    fn grace_period_defaults_like_kubevirt() {
        let mut spec = VmiSpec::default();
        assert_eq!(grace_period_seconds(&spec), 30);
        spec.termination_grace_period_seconds = Some(0);
        assert_eq!(grace_period_seconds(&spec), 0);
        spec.termination_grace_period_seconds = Some(-5);
        assert_eq!(grace_period_seconds(&spec), 0);
    }
}

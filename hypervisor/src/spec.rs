//! The hypervisor-level description of one domain: plain Rust, no libvirt, no XML.
//!
//! A [`DomainSpec`] is what the adapter renders into libvirt domain XML (see [`crate::xml`]).
//! It is deliberately not `core`'s VMI: [`crate::mapping`] maps core's expanded VMI onto it.
//! [`DomainSpec::validate`] collects every problem with its field path, so a bad spec is
//! rejected with all its causes at once and before libvirt sees it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use uuid::Uuid;

use crate::error::{SpecError, SpecProblem};

/// The XML namespace of vmplane's domain metadata (`<metadata><vmplane:instance …>`).
pub const METADATA_NAMESPACE_URI: &str = "https://vmplane.dev/xmlns/domain/1";
/// The prefix bound to [`METADATA_NAMESPACE_URI`] in rendered XML.
pub const METADATA_NAMESPACE_PREFIX: &str = "vmplane";

/// The machine type of a VMI that names none: KubeVirt's default on amd64 (`q35`, which QEMU
/// and libvirt resolve to the newest `pc-q35-<version>` the emulator has).
pub const MACHINE_TYPE_DEFAULT: &str = vmplane_core::defaults::DEFAULT_MACHINE_TYPE_AMD64;

/// Whether vmplane runs machine type `machine`: Q35 machines only, `q35` or `pc-q35-<version>`.
/// The i440FX machines (`pc`, `pc-i440fx-*`) are refused: secure boot needs Q35's SMM, and
/// vmplane's devices (SATA on AHCI, PCIe) are laid out for Q35. One rule with admission's
/// ([`vmplane_core::validate::machine_type_problem`]), which refuses such a VM at apply; this
/// check stays for a VM stored before admission refused it.
pub fn machine_type_problem(machine: &str) -> Option<String> {
    vmplane_core::validate::machine_type_problem(machine)
}

/// Longest libvirt domain name vmplane produces, in bytes.
pub const DOMAIN_NAME_BYTES_MAX: usize = 128;
/// How much of `namespace_name` a hashed domain name keeps readable, in bytes.
const DOMAIN_NAME_READABLE_BYTES_MAX: usize = 48;
/// Most vCPUs one domain may have (QEMU's x86 `pc`/`q35` limit is higher; this bounds input).
pub const DOMAIN_VCPUS_MAX: u32 = 1024;
/// Smallest memory a domain may have, in bytes (1 MiB).
pub const DOMAIN_MEMORY_BYTES_MIN: u64 = 1 << 20;
/// Longest user-supplied text (names, label keys and values, paths, serial), in bytes.
pub const TEXT_BYTES_MAX: usize = 4096;

/// The UUID namespace for hashed domain names (a v5 UUID of `len(ns):ns/name`).
const DOMAIN_NAME_UUID_NAMESPACE: Uuid = Uuid::from_u128(0x5f0c_2d7e_8a41_4b6f_9c3e_1d2a_7b8e_4f60);

/// A libvirt domain name that vmplane produced: only `[A-Za-z0-9._-]`, at most
/// [`DOMAIN_NAME_BYTES_MAX`] bytes, never empty.
///
/// [`DomainName::for_instance`] derives it deterministically from a VMI's namespace and name:
///
/// - `vmplane_<namespace>_<name>` when both are DNS-1123 subdomains (`[a-z0-9]`, inner `.`/`-`)
///   and the result fits. Neither part can contain `_`, so the split is unambiguous — this is
///   KubeVirt's `<namespace>_<name>` with a prefix that tells an operator whose domain it is.
/// - otherwise `vmplane-<readable>-<hash>`: `<readable>` is the first 48 bytes of
///   `<namespace>_<name>` with every byte outside `[A-Za-z0-9._-]` replaced by `-`, and `<hash>`
///   is the first 16 hex digits of a v5 UUID of `len(namespace):namespace/name` (unambiguous
///   for any pair). The `-` after `vmplane` keeps the two forms apart.
///
/// The name is only a label for people and for libvirt's uniqueness check: vmplane recognises
/// its domains by their metadata and addresses them by UUID, never by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainName(String);

impl DomainName {
    /// The deterministic libvirt-safe name of the domain of `namespace`/`name`.
    pub fn for_instance(namespace: &str, name: &str) -> DomainName {
        let readable = format!("vmplane_{namespace}_{name}");
        if is_dns1123_subdomain(namespace)
            && is_dns1123_subdomain(name)
            && readable.len() <= DOMAIN_NAME_BYTES_MAX
        {
            return DomainName(readable);
        }
        let mut prefix: String = format!("{namespace}_{name}")
            .bytes()
            .take(DOMAIN_NAME_READABLE_BYTES_MAX)
            .map(|b| {
                if is_domain_name_byte(b) {
                    b as char
                } else {
                    '-'
                }
            })
            .collect();
        if prefix.is_empty() {
            prefix.push('-');
        }
        let key = format!("{}:{namespace}/{name}", namespace.len());
        let hash = Uuid::new_v5(&DOMAIN_NAME_UUID_NAMESPACE, key.as_bytes())
            .simple()
            .to_string();
        DomainName(format!("vmplane-{prefix}-{}", &hash[..16]))
    }

    /// Accepts an existing name if it is libvirt-safe in vmplane's sense (see the type's doc).
    pub fn parse(name: &str) -> Result<DomainName, SpecError> {
        if name.is_empty()
            || name.len() > DOMAIN_NAME_BYTES_MAX
            || !name.bytes().all(is_domain_name_byte)
        {
            return Err(SpecError::single(
                "name",
                format!(
                    "{name:?} is not a domain name: 1 to {DOMAIN_NAME_BYTES_MAX} bytes of [A-Za-z0-9._-]"
                ),
            ));
        }
        Ok(DomainName(name.to_owned()))
    }

    /// The name as libvirt sees it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_domain_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

fn is_dns1123_subdomain(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-'))
}

/// Everything vmplane renders into one libvirt domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSpec {
    /// The libvirt domain name (see [`DomainName::for_instance`]).
    pub name: DomainName,
    /// The VM's firmware UUID: the domain `<uuid>` and the SMBIOS system UUID.
    pub firmware_uuid: Uuid,
    /// The SMBIOS system serial; `None` uses the firmware UUID's text.
    pub serial: Option<String>,
    /// Which libvirt domain type to ask for.
    pub virt_type: VirtType,
    /// The emulator binary (`<emulator>`), when QEMU is not where libvirt looks by default.
    pub emulator: Option<PathBuf>,
    /// vCPU topology; the vCPU count is its product.
    pub cpu: CpuTopology,
    /// Guest memory in bytes; rendered in KiB, rounded up.
    pub memory_bytes: u64,
    /// The machine type (`<os><type machine=…>`): `q35`, libvirt's alias of the emulator's
    /// newest Q35 machine, or a versioned `pc-q35-<version>` (see [`MACHINE_TYPE_DEFAULT`]).
    pub machine: String,
    /// BIOS or EFI.
    pub firmware: Firmware,
    /// Disks and CD-ROMs, in boot order.
    pub disks: Vec<Disk>,
    /// Network interfaces.
    pub interfaces: Vec<Interface>,
    /// vmplane's metadata: which VMI this domain runs. It is what makes a domain vmplane's.
    pub metadata: InstanceMetadata,
    /// Where it may run, not part of the domain: the labels a node must have (the VMI's
    /// `spec.nodeSelector`, [`crate::Node::labels`]).
    pub node_selector: BTreeMap<String, String>,
}

/// The libvirt domain `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum VirtType {
    /// `type='qemu'`: TCG on QEMU, also accepted by the test driver. Portable.
    #[default]
    Qemu,
    /// `type='kvm'`: hardware acceleration; needs `/dev/kvm`.
    Kvm,
}

/// vCPU topology: `sockets × cores × threads` vCPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuTopology {
    /// CPU sockets.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

impl CpuTopology {
    /// `n` vCPUs as `n` sockets of one core of one thread (KubeVirt's default shape).
    pub fn sockets(n: u32) -> CpuTopology {
        CpuTopology {
            sockets: n,
            cores: 1,
            threads: 1,
        }
    }

    /// The vCPU count, `None` if the product overflows.
    pub fn vcpus(&self) -> Option<u32> {
        self.sockets
            .checked_mul(self.cores)?
            .checked_mul(self.threads)
    }
}

/// Guest firmware.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Firmware {
    /// Legacy BIOS (SeaBIOS on QEMU).
    #[default]
    Bios,
    /// UEFI, picked by libvirt's firmware auto-selection (`<os firmware='efi'>`).
    Efi {
        /// Secure boot with enrolled keys; implies SMM and the q35 machine type.
        secure_boot: bool,
    },
}

/// One disk or CD-ROM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Disk {
    /// The disk's name in the VMI; rendered as the device alias `ua-<name>`.
    /// `[A-Za-z0-9_-]`, unique within the domain.
    pub name: String,
    /// The guest device name (`vda`, `sda`, …): `vd*` on virtio, `sd*` on SATA and SCSI.
    pub target_dev: String,
    /// The bus the guest sees.
    pub bus: DiskBus,
    /// Disk or CD-ROM.
    pub device: DiskDevice,
    /// The backing file (absolute path). `None` is an empty CD-ROM drive, or a disk whose
    /// contents vmplane does not provide (a container disk, a PVC): libvirt refuses a disk
    /// device without a source, so such a disk is not rendered at all.
    pub source: Option<PathBuf>,
    /// The backing file's format.
    pub format: DiskFormat,
    /// Read-only to the guest (CD-ROMs always are).
    pub readonly: bool,
}

/// A disk's bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiskBus {
    /// virtio-blk.
    Virtio,
    /// SATA (AHCI).
    Sata,
    /// SCSI, on a virtio-scsi controller.
    Scsi,
}

impl DiskBus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DiskBus::Virtio => "virtio",
            DiskBus::Sata => "sata",
            DiskBus::Scsi => "scsi",
        }
    }

    /// The device-name prefix a guest uses on this bus.
    fn target_prefix(self) -> &'static str {
        match self {
            DiskBus::Virtio => "vd",
            DiskBus::Sata | DiskBus::Scsi => "sd",
        }
    }
}

/// Disk or CD-ROM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiskDevice {
    /// A block device.
    Disk,
    /// A CD-ROM drive (read-only, may be empty).
    Cdrom,
}

/// The format of a disk's backing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DiskFormat {
    /// Raw image.
    #[default]
    Raw,
    /// qcow2 image.
    Qcow2,
}

/// One network interface.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Interface {
    /// The interface's name in the VMI; rendered as the device alias `ua-<name>`.
    pub name: String,
    /// The NIC model the guest sees.
    pub model: NicModel,
    /// The MAC address (unicast).
    pub mac: MacAddress,
    /// Where the interface is plugged in.
    pub source: InterfaceSource,
}

/// NIC models vmplane renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NicModel {
    /// virtio-net.
    Virtio,
    /// Intel e1000.
    E1000,
    /// Intel e1000e.
    E1000e,
    /// Realtek rtl8139.
    Rtl8139,
}

impl NicModel {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NicModel::Virtio => "virtio",
            NicModel::E1000 => "e1000",
            NicModel::E1000e => "e1000e",
            NicModel::Rtl8139 => "rtl8139",
        }
    }
}

/// Where an interface is plugged in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InterfaceSource {
    /// A libvirt virtual network, by name (`<interface type='network'>`).
    Network(String),
    /// User-mode networking (`<interface type='user'>`, KubeVirt's `masquerade`-like slirp).
    User,
}

/// A MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddress(pub [u8; 6]);

impl MacAddress {
    /// True for a multicast address (low bit of the first octet), which a NIC cannot have.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddress {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<MacAddress, SpecError> {
        let bad = || {
            SpecError::single(
                "mac",
                format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"),
            )
        };
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(bad)?;
            // `from_str_radix` alone would take a sign ("+f").
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddress(out))
    }
}

/// vmplane's metadata in a domain: which VMI it runs. Rendered into `<metadata>` under
/// [`METADATA_NAMESPACE_URI`] and read back for adoption after a restart.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InstanceMetadata {
    /// The VM (and VMI) name.
    pub name: String,
    /// The VM's namespace.
    pub namespace: String,
    /// The VMI's uid: which run of the VM this domain is.
    pub vmi_uid: Uuid,
    /// Labels worth seeing from the host side (`virsh dumpxml`); may be empty.
    pub labels: BTreeMap<String, String>,
}

/// Why a text is not acceptable in a domain, if it is not.
///
/// XML 1.0 cannot carry most control characters at all (not even as character references),
/// and parsers normalise the rest (tab, CR, LF) inside attribute values, so vmplane rejects
/// every control character (Unicode category Cc) and the noncharacters U+FFFE/U+FFFF instead
/// of letting a value change on its way through libvirt. Everything else is escaped by the XML
/// writer.
pub fn text_problem(text: &str) -> Option<String> {
    if text.len() > TEXT_BYTES_MAX {
        return Some(format!(
            "is {} bytes, more than {TEXT_BYTES_MAX}",
            text.len()
        ));
    }
    text.chars()
        .find(|c| c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}'))
        .map(|c| {
            format!(
                "contains the control character U+{:04X}, which XML cannot carry",
                c as u32
            )
        })
}

impl InstanceMetadata {
    /// Collects the metadata's problems under `path` (e.g. `metadata`).
    pub fn problems(&self, path: &str, out: &mut Vec<SpecProblem>) {
        non_empty_text(&format!("{path}.name"), &self.name, out);
        non_empty_text(&format!("{path}.namespace"), &self.namespace, out);
        for (key, value) in &self.labels {
            let field = format!("{path}.labels[{key:?}]");
            non_empty_text(&field, key, out);
            if let Some(p) = text_problem(value) {
                out.push(SpecProblem::new(field, format!("value {p}")));
            }
        }
    }

    /// Checks the metadata alone (what [`DomainSpec::validate`] checks of it).
    pub fn validate(&self) -> Result<(), SpecError> {
        let mut problems = Vec::new();
        self.problems("metadata", &mut problems);
        SpecError::from_problems(problems)
    }
}

fn non_empty_text(field: &str, text: &str, out: &mut Vec<SpecProblem>) {
    if text.is_empty() {
        out.push(SpecProblem::new(field, "must not be empty"));
    } else if let Some(p) = text_problem(text) {
        out.push(SpecProblem::new(field, p));
    }
}

fn is_alias_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

impl DomainSpec {
    /// The vCPU count (`sockets × cores × threads`), 0 if the product overflows.
    pub fn vcpus(&self) -> u32 {
        self.cpu.vcpus().unwrap_or(0)
    }

    /// The SMBIOS serial: the given one, or the firmware UUID's text.
    pub fn effective_serial(&self) -> String {
        self.serial
            .clone()
            .unwrap_or_else(|| self.firmware_uuid.to_string())
    }

    /// Checks everything libvirt would reject or mangle, collecting every problem with its
    /// field path. Rendering ([`crate::xml::render_domain`]) calls this first.
    pub fn validate(&self) -> Result<(), SpecError> {
        let mut problems = Vec::new();
        let CpuTopology {
            sockets,
            cores,
            threads,
        } = self.cpu;
        for (field, v) in [
            ("cpu.sockets", sockets),
            ("cpu.cores", cores),
            ("cpu.threads", threads),
        ] {
            if v == 0 {
                problems.push(SpecProblem::new(field, "must be at least 1"));
            }
        }
        match self.cpu.vcpus() {
            Some(n) if n <= DOMAIN_VCPUS_MAX => {}
            _ => problems.push(SpecProblem::new(
                "cpu",
                format!("sockets × cores × threads must be at most {DOMAIN_VCPUS_MAX} vCPUs"),
            )),
        }
        if self.memory_bytes < DOMAIN_MEMORY_BYTES_MIN {
            problems.push(SpecProblem::new(
                "memory_bytes",
                format!(
                    "{} is less than {DOMAIN_MEMORY_BYTES_MIN} bytes",
                    self.memory_bytes
                ),
            ));
        }
        if let Some(serial) = &self.serial {
            non_empty_text("serial", serial, &mut problems);
        }
        if let Some(problem) = machine_type_problem(&self.machine) {
            problems.push(SpecProblem::new("machine", problem));
        }
        if let Some(emulator) = &self.emulator {
            path_problems("emulator", emulator, &mut problems);
        }
        let mut disk_names = std::collections::HashSet::new();
        let mut targets = std::collections::HashSet::new();
        for (i, disk) in self.disks.iter().enumerate() {
            let at = |f: &str| format!("disks[{i}].{f}");
            if !is_alias_name(&disk.name) {
                problems.push(SpecProblem::new(
                    at("name"),
                    format!("{:?} must be 1 to 64 bytes of [A-Za-z0-9_-]", disk.name),
                ));
            } else if !disk_names.insert(disk.name.as_str()) {
                problems.push(SpecProblem::new(
                    at("name"),
                    format!("{:?} is used twice", disk.name),
                ));
            }
            let prefix = disk.bus.target_prefix();
            let suffix_ok = disk.target_dev.strip_prefix(prefix).is_some_and(|rest| {
                !rest.is_empty() && rest.len() <= 3 && rest.bytes().all(|b| b.is_ascii_lowercase())
            });
            if !suffix_ok {
                problems.push(SpecProblem::new(
                    at("target_dev"),
                    format!(
                        "{:?} must be {prefix}[a-z]{{1,3}} on bus {}",
                        disk.target_dev,
                        disk.bus.as_str()
                    ),
                ));
            } else if !targets.insert(disk.target_dev.as_str()) {
                problems.push(SpecProblem::new(
                    at("target_dev"),
                    format!("{:?} is used twice", disk.target_dev),
                ));
            }
            // A disk without a source is a drive without media: vmplane does not provide
            // disk contents (container disks, PVCs, DataVolumes), see `crate::mapping`.
            if let Some(path) = &disk.source {
                path_problems(&at("source"), path, &mut problems);
            }
            if disk.device == DiskDevice::Cdrom && disk.bus == DiskBus::Virtio {
                problems.push(SpecProblem::new(
                    at("bus"),
                    "a CD-ROM cannot be on virtio; use sata or scsi",
                ));
            }
        }
        let mut nic_names = std::collections::HashSet::new();
        let mut macs = std::collections::HashSet::new();
        for (i, nic) in self.interfaces.iter().enumerate() {
            let at = |f: &str| format!("interfaces[{i}].{f}");
            if !is_alias_name(&nic.name) {
                problems.push(SpecProblem::new(
                    at("name"),
                    format!("{:?} must be 1 to 64 bytes of [A-Za-z0-9_-]", nic.name),
                ));
            } else if !nic_names.insert(nic.name.as_str()) {
                problems.push(SpecProblem::new(
                    at("name"),
                    format!("{:?} is used twice", nic.name),
                ));
            }
            if nic.mac.is_multicast() {
                problems.push(SpecProblem::new(
                    at("mac"),
                    format!("{} is a multicast address", nic.mac),
                ));
            } else if !macs.insert(nic.mac) {
                problems.push(SpecProblem::new(
                    at("mac"),
                    format!("{} is used twice", nic.mac),
                ));
            }
            if let InterfaceSource::Network(network) = &nic.source {
                non_empty_text(&at("source.network"), network, &mut problems);
            }
        }
        self.metadata.problems("metadata", &mut problems);
        SpecError::from_problems(problems)
    }
}

fn path_problems(field: &str, path: &std::path::Path, out: &mut Vec<SpecProblem>) {
    match path.to_str() {
        None => out.push(SpecProblem::new(field, "is not valid UTF-8")),
        Some(text) if !path.is_absolute() => {
            out.push(SpecProblem::new(
                field,
                format!("{text:?} is not an absolute path"),
            ));
        }
        Some(text) => {
            if let Some(p) = text_problem(text) {
                out.push(SpecProblem::new(field, p));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_name_is_readable_for_dns_names() {
        assert_eq!(
            DomainName::for_instance("default", "my-vm").as_str(),
            "vmplane_default_my-vm"
        );
    }

    #[test]
    fn domain_name_is_hashed_and_safe_otherwise() {
        let a = DomainName::for_instance("a/b", "c<d>&'\"");
        assert!(a.as_str().starts_with("vmplane-a-b_c-d----"), "{a}");
        assert!(DomainName::parse(a.as_str()).is_ok());
        // The same characters split differently give a different name.
        assert_ne!(
            DomainName::for_instance("a_b", "c"),
            DomainName::for_instance("a", "b_c")
        );
        assert_ne!(
            DomainName::for_instance("a/b", "c"),
            DomainName::for_instance("a", "b/c")
        );
        let long = "x".repeat(300);
        assert!(DomainName::for_instance(&long, &long).as_str().len() <= DOMAIN_NAME_BYTES_MAX);
        assert!(DomainName::for_instance("", "").as_str().len() > "vmplane-".len());
    }

    #[test]
    fn mac_parses_and_prints() {
        let mac: MacAddress = "52:54:00:AB:cd:0f".parse().expect("valid mac");
        assert_eq!(mac.to_string(), "52:54:00:ab:cd:0f");
        assert!("52:54:00:ab:cd".parse::<MacAddress>().is_err());
        assert!("52:54:00:ab:cd:0f:00".parse::<MacAddress>().is_err());
        assert!("52:54:00:ab:cd:+f".parse::<MacAddress>().is_err());
    }

    /// Audit: `get vmi` said `machine: type: q35` while the domain was `pc-i440fx-…`.
    #[test]
    fn only_q35_machine_types_are_run() {
        for ok in ["q35", "pc-q35-7.2", "pc-q35-rhel9.2.0"] {
            assert_eq!(machine_type_problem(ok), None, "{ok}");
        }
        for refused in [
            "pc",
            "pc-i440fx-7.2",
            "",
            "pc-q35-",
            "microvm",
            "q35'><x",
            "Q35",
        ] {
            let problem = machine_type_problem(refused).expect(refused);
            assert!(problem.contains("vmplane runs Q35 machines"), "{problem}");
        }
    }

    #[test]
    fn text_with_control_characters_is_rejected() {
        assert!(text_problem("a\u{0}b").is_some());
        assert!(text_problem("a\nb").is_some());
        assert!(text_problem("a\u{85}b").is_some());
        assert!(text_problem("<]]>&'\" ünïcødé 🙂").is_none());
    }
}

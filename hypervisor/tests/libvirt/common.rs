//! Fixtures: private test-driver nodes and specs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmplane_hypervisor::{
    CpuTopology, Disk, DiskBus, DiskDevice, DiskFormat, DomainName, DomainSpec, Firmware,
    InstanceMetadata, Interface, InterfaceSource, LibvirtHypervisor, LibvirtOptions,
    LifecycleEvent, MACHINE_TYPE_DEFAULT, MacAddress, NicModel, VirtType,
};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A private libvirt test-driver node: `test://` + a node file of its own, so no other
/// connection of the process (tests run as threads of one process) sees its domains.
pub struct PrivateNode {
    pub uri: String,
    _dir: tempfile::TempDir,
}

impl PrivateNode {
    /// An empty node with the test driver's default capacity.
    pub fn empty() -> PrivateNode {
        PrivateNode::with_xml("<node>\n</node>\n")
    }

    /// An empty node with `cpus` CPUs and `memory_kib` KiB of memory.
    pub fn with_capacity(cpus: u32, memory_kib: u64) -> PrivateNode {
        PrivateNode::with_xml(&format!(
            "<node>\n  <cpu><mhz>2000</mhz><model>i686</model><active>{cpus}</active>\
             <nodes>1</nodes><sockets>1</sockets><cores>{cpus}</cores><threads>1</threads></cpu>\n  \
             <memory>{memory_kib}</memory>\n</node>\n"
        ))
    }

    /// A node from a test-driver node file (which may hold fixture domains).
    pub fn with_xml(xml: &str) -> PrivateNode {
        let dir = tempfile::tempdir().expect("temp dir");
        let path: PathBuf = dir.path().join("node.xml");
        std::fs::write(&path, xml).expect("write node file");
        assert!(path.is_absolute());
        PrivateNode {
            uri: format!("test://{}", path.display()),
            _dir: dir,
        }
    }

    /// Opens the node with libvirt's schema check on every define, so every test that
    /// defines a domain also checks the rendered XML against libvirt's schema.
    pub fn open(&self) -> LibvirtHypervisor {
        let options = LibvirtOptions {
            validate_schema: true,
        };
        LibvirtHypervisor::open_with(&self.uri, options).expect("open private test node")
    }
}

pub fn metadata(namespace: &str, name: &str) -> InstanceMetadata {
    InstanceMetadata {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        vmi_uid: Uuid::new_v4(),
        labels: BTreeMap::from([("app".to_owned(), "demo".to_owned())]),
    }
}

/// The smallest spec: BIOS, one vCPU, 64 MiB, no devices.
pub fn minimal_spec(namespace: &str, name: &str) -> DomainSpec {
    DomainSpec {
        name: DomainName::for_instance(namespace, name),
        firmware_uuid: Uuid::new_v4(),
        serial: None,
        virt_type: VirtType::Qemu,
        emulator: None,
        cpu: CpuTopology::sockets(1),
        memory_bytes: 64 * MIB,
        machine: MACHINE_TYPE_DEFAULT.to_owned(),
        firmware: Firmware::Bios,
        disks: Vec::new(),
        interfaces: Vec::new(),
        metadata: metadata(namespace, name),
        node_selector: Default::default(),
    }
}

/// A spec using every device kind: EFI with secure boot, disks on every bus, an empty CD-ROM,
/// a network and a user interface.
pub fn full_spec(namespace: &str, name: &str) -> DomainSpec {
    let disk = |name: &str, dev: &str, bus, device, source: Option<&str>, readonly| Disk {
        name: name.to_owned(),
        target_dev: dev.to_owned(),
        bus,
        device,
        source: source.map(PathBuf::from),
        format: DiskFormat::Qcow2,
        readonly,
    };
    DomainSpec {
        cpu: CpuTopology {
            sockets: 1,
            cores: 2,
            threads: 2,
        },
        memory_bytes: 2 * GIB,
        serial: Some("serial-<&>'\"".to_owned()),
        firmware: Firmware::Efi { secure_boot: true },
        disks: vec![
            disk(
                "rootdisk",
                "vda",
                DiskBus::Virtio,
                DiskDevice::Disk,
                Some("/var/lib/vmplane/root.qcow2"),
                false,
            ),
            disk(
                "data",
                "sda",
                DiskBus::Sata,
                DiskDevice::Disk,
                Some("/var/lib/vmplane/a b&c.img"),
                true,
            ),
            disk(
                "scratch",
                "sdb",
                DiskBus::Scsi,
                DiskDevice::Disk,
                Some("/var/lib/vmplane/s.img"),
                false,
            ),
            disk(
                "cloudinit",
                "sdc",
                DiskBus::Sata,
                DiskDevice::Cdrom,
                None,
                true,
            ),
        ],
        interfaces: vec![
            Interface {
                name: "default".to_owned(),
                model: NicModel::Virtio,
                mac: MacAddress([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
                source: InterfaceSource::Network("default".to_owned()),
            },
            Interface {
                name: "slirp".to_owned(),
                model: NicModel::E1000,
                mac: MacAddress([0x52, 0x54, 0x00, 0x12, 0x34, 0x57]),
                source: InterfaceSource::User,
            },
        ],
        ..minimal_spec(namespace, name)
    }
}

/// Waits for an event matching `pred`, up to `timeout`; returns every event seen.
pub fn wait_for(
    rx: &Receiver<LifecycleEvent>,
    timeout: Duration,
    pred: impl Fn(&LifecycleEvent) -> bool,
) -> (bool, Vec<LifecycleEvent>) {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(event) => {
                let hit = pred(&event);
                seen.push(event);
                if hit {
                    return (true, seen);
                }
            }
            Err(_) => break,
        }
    }
    (false, seen)
}

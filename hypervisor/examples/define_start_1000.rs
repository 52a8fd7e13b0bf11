//! Measures define+start of 1,000 domains on a private libvirt test-driver node, through the
//! adapter and through raw `virt` calls (the baseline), in the same run.
//!
//! `cargo run -p vmplane-hypervisor --example define_start_1000 [--release] [-- COUNT]`

use std::error::Error;
use std::time::{Duration, Instant};

use uuid::Uuid;
use virt::connect::Connect;
use vmplane_hypervisor::{
    CpuTopology, DomainName, DomainSpec, Firmware, Hypervisor, InstanceMetadata, LibvirtHypervisor,
    LibvirtOptions, MACHINE_TYPE_DEFAULT, VirtType, render_domain,
};

fn spec(i: usize) -> DomainSpec {
    let name = format!("vm{i}");
    DomainSpec {
        name: DomainName::for_instance("bench", &name),
        firmware_uuid: Uuid::new_v4(),
        serial: None,
        virt_type: VirtType::Qemu,
        emulator: None,
        cpu: CpuTopology::sockets(1),
        memory_bytes: 64 << 20,
        machine: MACHINE_TYPE_DEFAULT.to_owned(),
        firmware: Firmware::Bios,
        disks: Vec::new(),
        interfaces: Vec::new(),
        metadata: InstanceMetadata {
            name,
            namespace: "bench".into(),
            vmi_uid: Uuid::new_v4(),
            labels: Default::default(),
        },
        node_selector: Default::default(),
    }
}

fn per(total: Duration, count: usize) -> String {
    format!(
        "{total:.2?} ({:.1} µs each)",
        total.as_secs_f64() * 1e6 / count as f64
    )
}

fn private_node(dir: &std::path::Path, name: &str) -> Result<String, Box<dyn Error>> {
    let node_file = dir.join(name);
    std::fs::write(&node_file, "<node>\n</node>\n")?;
    Ok(format!("test://{}", node_file.display()))
}

fn main() -> Result<(), Box<dyn Error>> {
    let count: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1000);
    let dir = tempfile::tempdir()?;
    vmplane_hypervisor::libvirt::init()?;
    println!("{count} domains, each run on a fresh private test-driver node");

    for (flags, label) in [
        (0, "raw virt: define + create"),
        (
            virt::sys::VIR_DOMAIN_DEFINE_VALIDATE,
            "raw virt: define VALIDATE + create",
        ),
    ] {
        let conn = Connect::open(Some(&private_node(dir.path(), &format!("raw{flags}.xml"))?))?;
        let xmls: Vec<String> = (0..count)
            .map(|i| render_domain(&spec(i)))
            .collect::<Result<_, _>>()?;
        let start = Instant::now();
        let mut domains = Vec::with_capacity(count);
        for xml in &xmls {
            domains.push(conn.define_domain_xml_flags(xml, flags)?);
        }
        let defined = start.elapsed();
        for dom in &domains {
            dom.create()?;
        }
        println!(
            "{label:<44} {} (define {})",
            per(start.elapsed(), count),
            per(defined, count)
        );
    }

    for validate_schema in [false, true] {
        let uri = private_node(dir.path(), &format!("adapter{validate_schema}.xml"))?;
        let hv = LibvirtHypervisor::open_with(&uri, LibvirtOptions { validate_schema })?;
        let specs: Vec<DomainSpec> = (0..count).map(spec).collect();
        let start = Instant::now();
        for s in &specs {
            hv.define(s)?;
        }
        let defined = start.elapsed();
        for s in &specs {
            hv.start(s.firmware_uuid)?;
        }
        let label = format!("adapter (validate_schema={validate_schema}): define + start");
        println!(
            "{label:<44} {} (define {})",
            per(start.elapsed(), count),
            per(defined, count)
        );
        if validate_schema {
            break;
        }
        let start = Instant::now();
        let listed = hv.list_owned()?;
        println!(
            "{:<44} {:.2?} ({} domains)",
            "adapter: list_owned",
            start.elapsed(),
            listed.len()
        );
        let start = Instant::now();
        for s in &specs {
            hv.destroy(s.firmware_uuid)?;
            hv.undefine(s.firmware_uuid)?;
        }
        println!(
            "{:<44} {}",
            "adapter: destroy + undefine",
            per(start.elapsed(), count)
        );
    }
    Ok(())
}

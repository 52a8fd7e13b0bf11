//! Rendered XML against libvirt's schema (the real `virt-xml-validate`), the test driver's
//! validating define, and what libvirt keeps of the identity.

use std::process::Command;

use vmplane_hypervisor::{
    DomainSpec, Firmware, Hypervisor, SpecError, VirtType, parse_metadata, render_domain,
};

use crate::common::{PrivateNode, full_spec, minimal_spec};

fn specs() -> Vec<(&'static str, DomainSpec)> {
    let mut efi = minimal_spec("default", "efi");
    efi.firmware = Firmware::Efi { secure_boot: false };
    let mut kvm = minimal_spec("default", "kvm");
    kvm.virt_type = VirtType::Kvm;
    kvm.emulator = Some("/usr/bin/qemu-system-x86_64".into());
    let mut meta = minimal_spec("ns<&>'\"", "a]]>b</vmplane:name>");
    meta.metadata
        .labels
        .insert("k\"<>&'".into(), "v]]>&amp;<x/>".into());
    meta.metadata.labels.insert("ünï".into(), "cødé 🙂".into());
    meta.metadata.labels.insert("empty".into(), String::new());
    vec![
        ("minimal", minimal_spec("default", "minimal")),
        ("full", full_spec("team-a", "full")),
        ("efi", efi),
        ("kvm", kvm),
        ("metacharacters", meta),
    ]
}

#[test]
fn rendered_xml_passes_virt_xml_validate() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (label, spec) in specs() {
        let xml = render_domain(&spec).expect("valid spec renders");
        let path = dir.path().join(format!("{label}.xml"));
        std::fs::write(&path, &xml).expect("write xml");
        let out = Command::new("virt-xml-validate")
            .arg(&path)
            .arg("domain")
            .output()
            .expect("virt-xml-validate must be installed (libvirt-clients, libxml2-utils)");
        assert!(
            out.status.success(),
            "{label}: virt-xml-validate failed: {}{}\n{xml}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn virt_xml_validate_rejects_what_it_should() {
    // The validator test above would be worthless if the validator accepted anything.
    let dir = tempfile::tempdir().expect("temp dir");
    let xml = render_domain(&minimal_spec("default", "bad")).expect("renders");
    let bad = xml.replacen("<devices>", "<devices><bogus/>", 1);
    let path = dir.path().join("bad.xml");
    std::fs::write(&path, bad).expect("write xml");
    let status = Command::new("virt-xml-validate")
        .arg(&path)
        .arg("domain")
        .output()
        .expect("virt-xml-validate runs")
        .status;
    assert!(!status.success());
}

#[test]
fn rendered_xml_defines_with_schema_validation_on_the_test_driver() {
    let node = PrivateNode::empty();
    let hv = node.open();
    for (label, spec) in specs() {
        hv.define(&spec).unwrap_or_else(|e| panic!("{label}: {e}"));
        hv.start(spec.firmware_uuid)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
    }
    assert_eq!(hv.list_owned().expect("list").len(), specs().len());
}

fn child<'a, 'i>(parent: roxmltree::Node<'a, 'i>, name: &str) -> roxmltree::Node<'a, 'i> {
    parent
        .children()
        .find(|n| n.has_tag_name(name))
        .unwrap_or_else(|| panic!("no <{name}> in <{}>", parent.tag_name().name()))
}

#[test]
fn firmware_uuid_is_the_domain_uuid_and_the_smbios_system_uuid() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let spec = full_spec("default", "identity");
    hv.define(&spec).expect("define");
    hv.start(spec.firmware_uuid).expect("start");
    let xml = hv.domain_xml(spec.firmware_uuid).expect("dumpxml");
    let doc = roxmltree::Document::parse(&xml).expect("libvirt's XML parses");
    let root = doc.root_element();
    let uuid = spec.firmware_uuid.to_string();
    assert_eq!(child(root, "uuid").text(), Some(uuid.as_str()));
    let system = child(child(root, "sysinfo"), "system");
    let entry = |name: &str| {
        system
            .children()
            .find(|n| n.attribute("name") == Some(name))
            .and_then(|n| n.text())
            .map(str::to_owned)
    };
    assert_eq!(entry("uuid").as_deref(), Some(uuid.as_str()));
    assert_eq!(entry("serial"), spec.serial.clone());
    assert_eq!(
        child(child(root, "os"), "smbios").attribute("mode"),
        Some("sysinfo")
    );
    assert_eq!(child(root, "name").text(), Some(spec.name.as_str()));
    // The metadata read back from libvirt's own rendering of the domain.
    assert_eq!(
        parse_metadata(&xml).expect("readable"),
        Some(spec.metadata.clone())
    );

    // Without an explicit serial, the serial is the firmware UUID.
    let plain = minimal_spec("default", "plain");
    hv.define(&plain).expect("define");
    let xml = hv.domain_xml(plain.firmware_uuid).expect("dumpxml");
    let serial = format!("<entry name='serial'>{}</entry>", plain.firmware_uuid);
    assert!(xml.contains(&serial), "{xml}");
}

#[test]
fn invalid_specs_are_rejected_with_every_problem_before_libvirt() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let mut spec = full_spec("default", "bad");
    spec.cpu.cores = 0;
    spec.memory_bytes = 1;
    spec.disks[0].target_dev = "sda".into(); // virtio needs vd*
    spec.disks[1].source = Some("relative.img".into()); // a source must be absolute
    spec.interfaces[1].mac = spec.interfaces[0].mac;
    spec.metadata.name = "evil\u{1}name".into();
    let err = render_domain(&spec).expect_err("invalid");
    let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "cpu.cores",
            "memory_bytes",
            "disks[0].target_dev",
            "disks[1].source",
            "interfaces[1].mac",
            "metadata.name"
        ],
        "{err}"
    );
    match hv.define(&spec) {
        Err(vmplane_hypervisor::HypervisorError::InvalidSpec { source, .. }) => {
            assert_eq!(
                source,
                SpecError {
                    problems: err.problems.clone()
                }
            );
        }
        other => panic!("expected InvalidSpec, got {other:?}"),
    }
    assert!(hv.list_owned().expect("list").is_empty());
}

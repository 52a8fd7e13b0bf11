//! Domain XML: [`render_domain`] writes a [`DomainSpec`] as libvirt domain XML, and
//! [`parse_metadata`] reads vmplane's [`InstanceMetadata`] back out of a domain's XML.
//!
//! Every value is written through `quick-xml`'s writer, which escapes `<>&'"` in text and
//! attributes; no XML is ever built by string formatting. Values XML cannot carry (control
//! characters) are rejected by [`DomainSpec::validate`], which rendering runs first, so the
//! XML libvirt parses has exactly the elements and attributes written here.
//!
//! The same XML works on libvirt's test driver and on QEMU, and passes `virt-xml-validate`
//! (libvirt 9.0's `domain.rng`); the crate's tests check both.

use quick_xml::Writer;
use quick_xml::events::{BytesText, Event};
use quick_xml::name::{Namespace, ResolveResult};
use quick_xml::reader::NsReader;

use crate::error::{MetadataError, SpecError};
use crate::spec::{
    DiskBus, DiskDevice, DiskFormat, DomainSpec, Firmware, InstanceMetadata, InterfaceSource,
    METADATA_NAMESPACE_PREFIX, METADATA_NAMESPACE_URI, VirtType,
};

/// The SMBIOS manufacturer and product vmplane's guests see.
const SMBIOS_MANUFACTURER: &str = "vmplane";
const SMBIOS_PRODUCT: &str = "vmplane";

// Element names inside `<vmplane:instance>`, without the prefix.
const META_INSTANCE: &str = "instance";
const META_NAME: &str = "name";
const META_NAMESPACE: &str = "namespace";
const META_VMI_UID: &str = "vmi-uid";
const META_LABELS: &str = "labels";
const META_LABEL: &str = "label";
const META_LABEL_KEY: &str = "key";

type W = Writer<Vec<u8>>;
type IoResult = std::io::Result<()>;

/// Renders `spec` as libvirt domain XML, after [`DomainSpec::validate`].
pub fn render_domain(spec: &DomainSpec) -> Result<String, SpecError> {
    spec.validate()?;
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let virt_type = match spec.virt_type {
        VirtType::Qemu => "qemu",
        VirtType::Kvm => "kvm",
    };
    // Writing into a Vec cannot fail; the io::Result only exists for other sinks.
    let written: IoResult = (|| {
        w.create_element("domain")
            .with_attribute(("type", virt_type))
            .write_inner_content(|w| write_domain_body(w, spec))?;
        Ok(())
    })();
    match written.map(|()| String::from_utf8(w.into_inner())) {
        Ok(Ok(xml)) => Ok(xml),
        Ok(Err(e)) => Err(SpecError::single(
            "",
            format!("rendered XML is not UTF-8: {e}"),
        )),
        Err(e) => Err(SpecError::single("", format!("writing XML failed: {e}"))),
    }
}

fn text_element(w: &mut W, name: &str, text: &str) -> IoResult {
    w.create_element(name)
        .write_text_content(BytesText::new(text))?;
    Ok(())
}

fn write_domain_body(w: &mut W, spec: &DomainSpec) -> IoResult {
    let uuid = spec.firmware_uuid.to_string();
    text_element(w, "name", spec.name.as_str())?;
    text_element(w, "uuid", &uuid)?;
    w.create_element("metadata")
        .write_inner_content(|w| write_metadata(w, &spec.metadata))?;
    let memory_kib = spec.memory_bytes.div_ceil(1024).to_string();
    w.create_element("memory")
        .with_attribute(("unit", "KiB"))
        .write_text_content(BytesText::new(&memory_kib))?;
    w.create_element("vcpu")
        .with_attribute(("placement", "static"))
        .write_text_content(BytesText::new(&spec.vcpus().to_string()))?;
    let serial = spec.effective_serial();
    w.create_element("sysinfo")
        .with_attribute(("type", "smbios"))
        .write_inner_content(|w| {
            w.create_element("system").write_inner_content(|w| {
                for (name, value) in [
                    ("manufacturer", SMBIOS_MANUFACTURER),
                    ("product", SMBIOS_PRODUCT),
                    ("serial", serial.as_str()),
                    ("uuid", uuid.as_str()),
                ] {
                    w.create_element("entry")
                        .with_attribute(("name", name))
                        .write_text_content(BytesText::new(value))?;
                }
                Ok(())
            })?;
            Ok(())
        })?;
    write_os(w, spec.firmware, &spec.machine)?;
    w.create_element("features").write_inner_content(|w| {
        w.create_element("acpi").write_empty()?;
        w.create_element("apic").write_empty()?;
        if matches!(spec.firmware, Firmware::Efi { secure_boot: true }) {
            w.create_element("smm")
                .with_attribute(("state", "on"))
                .write_empty()?;
        }
        Ok(())
    })?;
    let (sockets, cores, threads) = (
        spec.cpu.sockets.to_string(),
        spec.cpu.cores.to_string(),
        spec.cpu.threads.to_string(),
    );
    w.create_element("cpu").write_inner_content(|w| {
        w.create_element("topology")
            .with_attribute(("sockets", sockets.as_str()))
            .with_attribute(("dies", "1"))
            .with_attribute(("cores", cores.as_str()))
            .with_attribute(("threads", threads.as_str()))
            .write_empty()?;
        Ok(())
    })?;
    text_element(w, "on_poweroff", "destroy")?;
    text_element(w, "on_reboot", "restart")?;
    text_element(w, "on_crash", "destroy")?;
    w.create_element("devices")
        .write_inner_content(|w| write_devices(w, spec))?;
    Ok(())
}

fn write_os(w: &mut W, firmware: Firmware, machine: &str) -> IoResult {
    let mut os = w.create_element("os");
    if let Firmware::Efi { .. } = firmware {
        os = os.with_attribute(("firmware", "efi"));
    }
    os.write_inner_content(|w| {
        // Always a Q35 machine (`DomainSpec::validate`), which secure boot's SMM needs too.
        w.create_element("type")
            .with_attribute(("arch", "x86_64"))
            .with_attribute(("machine", machine))
            .write_text_content(BytesText::new("hvm"))?;
        if let Firmware::Efi { secure_boot } = firmware {
            let enabled = if secure_boot { "yes" } else { "no" };
            w.create_element("firmware").write_inner_content(|w| {
                for feature in ["enrolled-keys", "secure-boot"] {
                    w.create_element("feature")
                        .with_attribute(("enabled", enabled))
                        .with_attribute(("name", feature))
                        .write_empty()?;
                }
                Ok(())
            })?;
            if secure_boot {
                w.create_element("loader")
                    .with_attribute(("secure", "yes"))
                    .write_empty()?;
            }
        }
        w.create_element("smbios")
            .with_attribute(("mode", "sysinfo"))
            .write_empty()?;
        Ok(())
    })?;
    Ok(())
}

fn write_devices(w: &mut W, spec: &DomainSpec) -> IoResult {
    if let Some(emulator) = spec.emulator.as_ref().and_then(|p| p.to_str()) {
        text_element(w, "emulator", emulator)?;
    }
    for (i, disk) in spec.disks.iter().enumerate() {
        // libvirt refuses a disk device without a source ("missing source information"), and
        // vmplane does not provide disk contents: such a drive is left out of the domain.
        if disk.device == DiskDevice::Disk && disk.source.is_none() {
            continue;
        }
        let device = match disk.device {
            DiskDevice::Disk => "disk",
            DiskDevice::Cdrom => "cdrom",
        };
        let format = match disk.format {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        };
        let boot_order = (i + 1).to_string();
        let alias = format!("ua-{}", disk.name);
        w.create_element("disk")
            .with_attribute(("type", "file"))
            .with_attribute(("device", device))
            .write_inner_content(|w| {
                w.create_element("driver")
                    .with_attribute(("name", "qemu"))
                    .with_attribute(("type", format))
                    .write_empty()?;
                if let Some(source) = disk.source.as_ref().and_then(|p| p.to_str()) {
                    w.create_element("source")
                        .with_attribute(("file", source))
                        .write_empty()?;
                }
                w.create_element("target")
                    .with_attribute(("dev", disk.target_dev.as_str()))
                    .with_attribute(("bus", disk.bus.as_str()))
                    .write_empty()?;
                if disk.readonly || disk.device == DiskDevice::Cdrom {
                    w.create_element("readonly").write_empty()?;
                }
                w.create_element("boot")
                    .with_attribute(("order", boot_order.as_str()))
                    .write_empty()?;
                w.create_element("alias")
                    .with_attribute(("name", alias.as_str()))
                    .write_empty()?;
                Ok(())
            })?;
    }
    if spec.disks.iter().any(|d| d.bus == DiskBus::Scsi) {
        w.create_element("controller")
            .with_attribute(("type", "scsi"))
            .with_attribute(("index", "0"))
            .with_attribute(("model", "virtio-scsi"))
            .write_empty()?;
    }
    for nic in &spec.interfaces {
        let kind = match nic.source {
            InterfaceSource::Network(_) => "network",
            InterfaceSource::User => "user",
        };
        let mac = nic.mac.to_string();
        let alias = format!("ua-{}", nic.name);
        w.create_element("interface")
            .with_attribute(("type", kind))
            .write_inner_content(|w| {
                w.create_element("mac")
                    .with_attribute(("address", mac.as_str()))
                    .write_empty()?;
                if let InterfaceSource::Network(network) = &nic.source {
                    w.create_element("source")
                        .with_attribute(("network", network.as_str()))
                        .write_empty()?;
                }
                w.create_element("model")
                    .with_attribute(("type", nic.model.as_str()))
                    .write_empty()?;
                w.create_element("alias")
                    .with_attribute(("name", alias.as_str()))
                    .write_empty()?;
                Ok(())
            })?;
    }
    w.create_element("serial")
        .with_attribute(("type", "pty"))
        .write_empty()?;
    w.create_element("console")
        .with_attribute(("type", "pty"))
        .write_empty()?;
    w.create_element("memballoon")
        .with_attribute(("model", "none"))
        .write_empty()?;
    Ok(())
}

fn prefixed(local: &str) -> String {
    format!("{METADATA_NAMESPACE_PREFIX}:{local}")
}

/// Writes `<vmplane:instance xmlns:vmplane="…">` with the metadata's fields.
fn write_metadata(w: &mut W, meta: &InstanceMetadata) -> IoResult {
    let xmlns = format!("xmlns:{METADATA_NAMESPACE_PREFIX}");
    let uid = meta.vmi_uid.to_string();
    w.create_element(prefixed(META_INSTANCE))
        .with_attribute((xmlns.as_str(), METADATA_NAMESPACE_URI))
        .write_inner_content(|w| {
            text_element(w, &prefixed(META_NAME), &meta.name)?;
            text_element(w, &prefixed(META_NAMESPACE), &meta.namespace)?;
            text_element(w, &prefixed(META_VMI_UID), &uid)?;
            if !meta.labels.is_empty() {
                w.create_element(prefixed(META_LABELS))
                    .write_inner_content(|w| {
                        for (key, value) in &meta.labels {
                            w.create_element(prefixed(META_LABEL))
                                .with_attribute((META_LABEL_KEY, key.as_str()))
                                .write_text_content(BytesText::new(value))?;
                        }
                        Ok(())
                    })?;
            }
            Ok(())
        })?;
    Ok(())
}

/// How the `instance` element we look for is named in the document at hand.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NsMode {
    /// In a whole domain XML: bound to [`METADATA_NAMESPACE_URI`].
    Bound,
    /// In the fragment `virDomainGetMetadata` returns: libvirt strips the namespace.
    Unbound,
}

fn resolved_mode(res: &ResolveResult<'_>) -> Option<NsMode> {
    match res {
        ResolveResult::Bound(Namespace(ns)) if *ns == METADATA_NAMESPACE_URI.as_bytes() => {
            Some(NsMode::Bound)
        }
        ResolveResult::Unbound => Some(NsMode::Unbound),
        _ => None,
    }
}

fn xml_err(e: impl std::fmt::Display) -> MetadataError {
    MetadataError::new(format!("malformed XML: {e}"))
}

/// Reads vmplane's metadata out of a domain's XML (`virsh dumpxml`) or out of the fragment
/// `virDomainGetMetadata` returns for vmplane's namespace.
///
/// `Ok(None)`: the document has no vmplane `instance` element, so the domain is not vmplane's.
/// `Err`: it has one, but it is incomplete or not well-formed — a domain that claims to be
/// vmplane's and cannot be adopted as it is. Unknown child elements are ignored, so a later
/// vmplane can add fields.
pub fn parse_metadata(xml: &str) -> Result<Option<InstanceMetadata>, MetadataError> {
    let mut reader = NsReader::from_str(xml);
    let mut depth = 0usize;
    loop {
        let (res, event) = reader.read_resolved_event().map_err(xml_err)?;
        let mode = resolved_mode(&res);
        match event {
            Event::Start(e) => {
                depth += 1;
                let local = e.local_name();
                let is_instance = local.as_ref() == META_INSTANCE.as_bytes()
                    && match mode {
                        Some(NsMode::Bound) => true,
                        // An unprefixed `instance` only counts as the whole document.
                        Some(NsMode::Unbound) => depth == 1,
                        None => false,
                    };
                if let (true, Some(mode)) = (is_instance, mode) {
                    return parse_instance(&mut reader, mode).map(Some);
                }
            }
            Event::Empty(e)
                if e.local_name().as_ref() == META_INSTANCE.as_bytes()
                    && (mode == Some(NsMode::Bound)
                        || (mode == Some(NsMode::Unbound) && depth == 0)) =>
            {
                return Err(MetadataError::new("the instance element is empty"));
            }
            Event::End(_) => depth = depth.saturating_sub(1),
            Event::Eof => return Ok(None),
            _ => {}
        }
    }
}

/// The single-valued fields of the instance element, as read so far.
#[derive(Default)]
struct Fields {
    name: Option<String>,
    namespace: Option<String>,
    vmi_uid: Option<String>,
}

impl Fields {
    fn slot(&mut self, ours: bool, local: &[u8]) -> Option<&mut Option<String>> {
        if !ours {
            return None;
        }
        match local {
            l if l == META_NAME.as_bytes() => Some(&mut self.name),
            l if l == META_NAMESPACE.as_bytes() => Some(&mut self.namespace),
            l if l == META_VMI_UID.as_bytes() => Some(&mut self.vmi_uid),
            _ => None,
        }
    }
}

fn duplicate(local: &[u8]) -> MetadataError {
    MetadataError::new(format!("{} appears twice", String::from_utf8_lossy(local)))
}

fn parse_instance(
    reader: &mut NsReader<&[u8]>,
    mode: NsMode,
) -> Result<InstanceMetadata, MetadataError> {
    let mut fields = Fields::default();
    let mut labels = std::collections::BTreeMap::new();
    loop {
        let (res, event) = reader.read_resolved_event().map_err(xml_err)?;
        let ours = resolved_mode(&res) == Some(mode);
        match event {
            Event::Start(e) => {
                let local = e.local_name();
                if let Some(slot) = fields.slot(ours, local.as_ref()) {
                    if slot.replace(read_text(reader)?).is_some() {
                        return Err(duplicate(local.as_ref()));
                    }
                } else if ours && local.as_ref() == META_LABELS.as_bytes() {
                    read_labels(reader, mode, &mut labels)?;
                } else {
                    skip_element(reader)?;
                }
            }
            Event::Empty(e) => {
                let local = e.local_name();
                if let Some(slot) = fields.slot(ours, local.as_ref())
                    && slot.replace(String::new()).is_some()
                {
                    return Err(duplicate(local.as_ref()));
                }
            }
            Event::End(_) => break,
            Event::Eof => {
                return Err(MetadataError::new(
                    "document ends inside the instance element",
                ));
            }
            _ => {}
        }
    }
    let missing = |field: &str| MetadataError::new(format!("no {field}"));
    let name = fields.name.ok_or_else(|| missing(META_NAME))?;
    let namespace = fields.namespace.ok_or_else(|| missing(META_NAMESPACE))?;
    let uid = fields.vmi_uid.ok_or_else(|| missing(META_VMI_UID))?;
    let vmi_uid = uid
        .trim()
        .parse()
        .map_err(|e| MetadataError::new(format!("{META_VMI_UID} {uid:?} is not a UUID: {e}")))?;
    Ok(InstanceMetadata {
        name,
        namespace,
        vmi_uid,
        labels,
    })
}

fn read_labels(
    reader: &mut NsReader<&[u8]>,
    mode: NsMode,
    labels: &mut std::collections::BTreeMap<String, String>,
) -> Result<(), MetadataError> {
    loop {
        let (res, event) = reader.read_resolved_event().map_err(xml_err)?;
        let ours = resolved_mode(&res) == Some(mode);
        let (e, has_content) = match event {
            Event::Start(e) => (e, true),
            Event::Empty(e) => (e, false),
            Event::End(_) => return Ok(()),
            Event::Eof => return Err(MetadataError::new("document ends inside labels")),
            _ => continue,
        };
        if !(ours && e.local_name().as_ref() == META_LABEL.as_bytes()) {
            if has_content {
                skip_element(reader)?;
            }
            continue;
        }
        let key = e
            .try_get_attribute(META_LABEL_KEY)
            .map_err(xml_err)?
            .ok_or_else(|| MetadataError::new("a label has no key"))?
            .unescape_value()
            .map_err(xml_err)?
            .into_owned();
        let value = if has_content {
            read_text(reader)?
        } else {
            String::new()
        };
        if labels.insert(key.clone(), value).is_some() {
            return Err(MetadataError::new(format!("label {key:?} appears twice")));
        }
    }
}

/// Reads the text of the element just opened, up to its end. A child element is an error.
fn read_text(reader: &mut NsReader<&[u8]>) -> Result<String, MetadataError> {
    let mut text = String::new();
    loop {
        match reader.read_event().map_err(xml_err)? {
            Event::Text(t) => text.push_str(&t.decode().map_err(xml_err)?),
            Event::CData(t) => text.push_str(&t.decode().map_err(xml_err)?),
            Event::GeneralRef(r) => {
                if let Some(c) = r.resolve_char_ref().map_err(xml_err)? {
                    text.push(c);
                } else {
                    let name = r.decode().map_err(xml_err)?;
                    let resolved = quick_xml::escape::resolve_predefined_entity(&name)
                        .ok_or_else(|| MetadataError::new(format!("unknown entity &{name};")))?;
                    text.push_str(resolved);
                }
            }
            Event::End(_) => return Ok(text),
            Event::Start(_) | Event::Empty(_) => {
                return Err(MetadataError::new("an element where text was expected"));
            }
            Event::Eof => return Err(MetadataError::new("document ends inside a text element")),
            _ => {}
        }
    }
}

fn skip_element(reader: &mut NsReader<&[u8]>) -> Result<(), MetadataError> {
    let mut depth = 1usize;
    while depth > 0 {
        match reader.read_event().map_err(xml_err)? {
            Event::Start(_) => depth += 1,
            Event::End(_) => depth -= 1,
            Event::Eof => return Err(MetadataError::new("document ends inside an element")),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b9f6e1c-3a52-4d7e-9f10-2c6b8a4d5e70";

    fn expect_err(xml: &str, needle: &str) {
        match parse_metadata(xml) {
            Err(e) => assert!(e.reason.contains(needle), "{e} does not say {needle:?}"),
            other => panic!("expected an error about {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn reads_the_unprefixed_fragment_libvirt_returns() {
        // What virDomainGetMetadata(ELEMENT, vmplane's URI) gives back: the namespace stripped.
        let xml = format!(
            "<instance>\n  <name>a&lt;b</name>\n  <namespace>ns</namespace>\n  \
             <vmi-uid>{UID}</vmi-uid>\n  <labels><label key=\"k&amp;\">v&#x41;</label>\
             <label key=\"e\"/></labels>\n</instance>"
        );
        let meta = parse_metadata(&xml).expect("readable").expect("present");
        assert_eq!((meta.name.as_str(), meta.namespace.as_str()), ("a<b", "ns"));
        assert_eq!(meta.vmi_uid.to_string(), UID);
        assert_eq!(meta.labels.get("k&").map(String::as_str), Some("vA"));
        assert_eq!(meta.labels.get("e").map(String::as_str), Some(""));
    }

    #[test]
    fn ignores_other_namespaces_and_unknown_fields() {
        let other = "<domain><metadata><x:instance xmlns:x='urn:other'><x:name>n</x:name>\
                     </x:instance></metadata><name>instance</name></domain>";
        assert_eq!(parse_metadata(other), Ok(None));
        // An unprefixed `instance` deeper in a domain is not ours either.
        assert_eq!(parse_metadata("<domain><instance/></domain>"), Ok(None));
        let newer = format!(
            "<domain><metadata><v:instance xmlns:v='{METADATA_NAMESPACE_URI}'><v:future><v:name>x</v:name>\
             </v:future><v:name>n</v:name><v:namespace>ns</v:namespace><v:vmi-uid>{UID}</v:vmi-uid>\
             </v:instance></metadata></domain>"
        );
        let meta = parse_metadata(&newer).expect("readable").expect("present");
        assert_eq!(meta.name, "n");
    }

    #[test]
    fn rejects_incomplete_or_broken_metadata() {
        expect_err(
            "<instance><name>n</name><namespace>ns</namespace></instance>",
            "no vmi-uid",
        );
        expect_err(
            &format!(
                "<instance><name>n</name><name>m</name><namespace>s</namespace><vmi-uid>{UID}</vmi-uid></instance>"
            ),
            "name appears twice",
        );
        expect_err(
            "<instance><name>n</name><namespace>s</namespace><vmi-uid>nope</vmi-uid></instance>",
            "not a UUID",
        );
        expect_err(
            "<instance><name>n<b/></name></instance>",
            "element where text",
        );
        expect_err("<instance><name>n</name>", "ends inside");
        expect_err(
            "<instance><name>&bogus;</name></instance>",
            "unknown entity",
        );
        expect_err("<instance/>", "empty");
    }
}

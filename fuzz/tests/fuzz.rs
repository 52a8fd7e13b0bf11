//! Fuzz targets for vmplane's hostile-input boundaries.
//!
//! Each target runs two ways under a plain `cargo test` on stable, bounded so CI stays quick:
//!
//! - the committed seed corpus (`corpus/<target>/`: real KubeVirt manifests, the golden event
//!   bytes of every event type and version) and a fixed number of deterministic mutations of
//!   every seed (bit flips, byte insertions and deletions, truncations, splices);
//! - bolero's `check!()`, which generates random inputs for a bounded number of iterations (and,
//!   under `cargo bolero test <target>`, drives libFuzzer, AFL or honggfuzz instead).
//!
//! `VMPLANE_FUZZ_SCALE` multiplies every bound (default 1).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmplane_hypervisor::spec::{
    CpuTopology, Disk, DiskBus, DiskDevice, DiskFormat, DomainName, DomainSpec, Firmware,
    InstanceMetadata, Interface, InterfaceSource, MacAddress, NicModel, VirtType,
};

/// Mutations of every seed per run.
const MUTATIONS_PER_SEED: usize = 300;
/// Random inputs bolero generates per target and run.
const RANDOM_ITERATIONS: usize = 3_000;
/// The most one input may take (debug build of the parsers' callers, optimized dependencies).
const INPUT_TIME_MAX: Duration = Duration::from_secs(2);

fn scale() -> usize {
    std::env::var("VMPLANE_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read seed");
            (p, bytes)
        })
        .collect()
}

/// splitmix64: deterministic mutations without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Tokens that make YAML and JSON interesting.
const DICTIONARY: &[&[u8]] = &[
    b"&a ",
    b"*a",
    b"[",
    b"]",
    b"{",
    b"}",
    b"- ",
    b": ",
    b"\n",
    b"  ",
    b"---\n",
    b"!!binary ",
    b"\"",
    b"'",
    b"\\u0000",
    b"0x",
    b"1e999",
    b"-1",
    b"18446744073709551616",
    b"<<: *a",
    b"~",
    b"null",
    b"?",
    b"|",
    b">",
    b"#",
    b"\t",
    b"\xff",
    b"\xc3\x28",
];

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(64));
                v.drain(i..i + n);
            }
            3 => v.truncate(rng.below(v.len() + 1)),
            4 => {
                let token = DICTIONARY[rng.below(DICTIONARY.len())];
                let i = rng.below(v.len() + 1);
                v.splice(i..i, token.iter().copied());
            }
            5 if !other.is_empty() => {
                // Splice a piece of another seed in.
                let a = rng.below(other.len());
                let b = a + rng.below((other.len() - a).min(256));
                let i = rng.below(v.len() + 1);
                v.splice(i..i, other[a..b].iter().copied());
            }
            _ if v.len() > 1 => {
                // Duplicate a region (repetition, nesting).
                let a = rng.below(v.len());
                let b = a + rng.below((v.len() - a).min(128));
                let piece = v[a..b].to_vec();
                v.splice(a..a, piece);
            }
            _ => {}
        }
    }
    v
}

/// Runs `property` on every seed and on MUTATIONS_PER_SEED mutations of each; returns the
/// number of executions.
fn run_corpus(target: &str, property: &dyn Fn(&[u8])) -> usize {
    let seeds = corpus(target);
    let mut rng = Rng(0x5EED ^ target.len() as u64);
    let mut executions = 0;
    let timed = |input: &[u8]| {
        let started = Instant::now();
        property(input);
        let took = started.elapsed();
        assert!(
            took < INPUT_TIME_MAX,
            "{target}: an input of {} bytes took {took:?}: {:?}",
            input.len(),
            String::from_utf8_lossy(&input[..input.len().min(200)])
        );
    };
    for (i, (_, seed)) in seeds.iter().enumerate() {
        timed(seed);
        executions += 1;
        let other = &seeds[(i + 1) % seeds.len()].1;
        for _ in 0..MUTATIONS_PER_SEED * scale() {
            timed(&mutate(&mut rng, seed, other));
            executions += 1;
        }
    }
    executions
}

// ---------------------------------------------------------------------------------------------
// Manifest parsing.

fn manifest_property(input: &[u8]) {
    // Any answer but a panic, a hang or unbounded memory; a parsed manifest re-serializes.
    if let Ok(manifest) = vmplane_core::types::parse_manifest(input) {
        let _ = manifest.to_value();
    }
}

#[test]
fn manifest_parsing_seeds_and_mutations() {
    let n = run_corpus("manifest", &manifest_property);
    println!("fuzz manifest: {n} executions over the seed corpus and its mutations");
}

#[test]
fn manifest_parsing_random_inputs() {
    bolero::check!()
        .with_iterations(RANDOM_ITERATIONS * scale())
        .for_each(|input: &[u8]| manifest_property(input));
}

// ---------------------------------------------------------------------------------------------
// Event decoding: every type name and version of the registry.

fn event_property(input: &[u8]) {
    let types = vmplane_core::event::EVENT_TYPES;
    let Some((&pick, bytes)) = input.split_first() else {
        return;
    };
    let (type_name, version) = types[pick as usize % types.len()];
    let decoded = vmplane_core::event::decode(type_name, version, bytes);
    let validated = vmplane_core::event::validate_payload(type_name, version, bytes);
    // validate_payload is decode plus a parse of every embedded JSON document: stricter.
    assert!(
        decoded.is_ok() || validated.is_err(),
        "validate_payload accepts what decode refuses: {type_name} v{version}"
    );
    // Unknown names and versions are refused, never panicked on.
    assert!(vmplane_core::event::decode(type_name, version + 1000, bytes).is_err());
}

#[test]
fn event_decoding_golden_seeds_and_mutations() {
    let types = vmplane_core::event::EVENT_TYPES;
    // Every golden file decodes as its own type, and its mutations under every type.
    for (path, bytes) in corpus("event") {
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let (name, rest) = file.split_once(".v").expect("NAME.vN.bin");
        let version: u16 = rest.trim_end_matches(".bin").parse().expect("version");
        vmplane_core::event::decode(name, version, &bytes)
            .unwrap_or_else(|e| panic!("golden {file} does not decode: {e}"));
    }
    let mut executions = 0;
    for i in 0..types.len() {
        let pick = i as u8;
        executions += run_corpus_with_prefix("event", pick, &event_property);
    }
    println!(
        "fuzz event decode: {executions} executions over {} event types and versions",
        types.len()
    );
}

/// The corpus with its seeds decoded as event type `pick` (a mutated fraction of each).
fn run_corpus_with_prefix(target: &str, pick: u8, property: &dyn Fn(&[u8])) -> usize {
    let seeds = corpus(target);
    let mut rng = Rng(u64::from(pick) << 32 | 0xE7E7);
    let mut executions = 0;
    let per_seed = (MUTATIONS_PER_SEED * scale() / 10).max(1);
    for (i, (_, seed)) in seeds.iter().enumerate() {
        let other = &seeds[(i + 1) % seeds.len()].1;
        let mut input = vec![pick];
        input.extend_from_slice(seed);
        property(&input);
        executions += 1;
        for _ in 0..per_seed {
            let mut input = vec![pick];
            input.extend(mutate(&mut rng, seed, other));
            property(&input);
            executions += 1;
        }
    }
    executions
}

#[test]
fn event_decoding_random_inputs() {
    bolero::check!()
        .with_iterations(RANDOM_ITERATIONS * scale())
        .for_each(|input: &[u8]| event_property(input));
}

// ---------------------------------------------------------------------------------------------
// Domain XML rendering: arbitrary names and values never inject XML.

/// The strings a hostile VM can put into its domain.
type DomainInput = (
    String,
    String,
    String,
    String,
    Vec<(String, String)>,
    Option<String>,
);

fn domain(input: &DomainInput) -> DomainSpec {
    let (name, namespace, disk, source, labels, serial) = input;
    DomainSpec {
        name: DomainName::for_instance(namespace, name),
        firmware_uuid: uuid::Uuid::from_u128(0x1234),
        serial: serial.clone(),
        virt_type: VirtType::Qemu,
        emulator: None,
        cpu: CpuTopology::sockets(1),
        memory_bytes: 64 << 20,
        firmware: Firmware::Bios,
        disks: vec![Disk {
            name: disk.clone(),
            target_dev: "vda".into(),
            bus: DiskBus::Virtio,
            device: DiskDevice::Disk,
            source: Some(PathBuf::from(source)),
            format: DiskFormat::Qcow2,
            readonly: false,
        }],
        interfaces: vec![Interface {
            name: "default".into(),
            model: NicModel::Virtio,
            mac: MacAddress([0x52, 0x54, 0, 0, 0, 1]),
            source: InterfaceSource::Network(disk.clone()),
        }],
        metadata: InstanceMetadata {
            name: name.clone(),
            namespace: namespace.clone(),
            vmi_uid: uuid::Uuid::from_u128(0x5678),
            labels: labels.iter().cloned().collect(),
        },
        node_selector: Default::default(),
        machine: vmplane_hypervisor::MACHINE_TYPE_DEFAULT.to_owned(),
    }
}

/// The element names of `xml`, in document order; panics when it is not well-formed.
fn element_names(xml: &str) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut names = Vec::new();
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e)) => {
                names.push(String::from_utf8_lossy(e.name().as_ref()).into_owned());
            }
            Ok(quick_xml::events::Event::Eof) => return names,
            Ok(quick_xml::events::Event::DocType(_) | quick_xml::events::Event::PI(_)) => {
                panic!("a doctype or processing instruction in the domain XML:\n{xml}")
            }
            Ok(_) => {}
            Err(e) => panic!("the domain XML does not parse: {e}\n{xml}"),
        }
    }
}

fn domain_property(input: &DomainInput) {
    let spec = domain(input);
    let Ok(xml) = vmplane_hypervisor::render_domain(&spec) else {
        return; // Refused by validation: fine.
    };
    // The same shape with harmless values: the elements must be exactly the same.
    let (_, _, _, _, labels, serial) = input;
    let benign: DomainInput = (
        "vm".into(),
        "ns".into(),
        "disk".into(),
        "/var/lib/disk.qcow2".into(),
        (0..labels.len())
            .map(|i| (format!("k{i}"), "v".into()))
            .collect(),
        serial.as_ref().map(|_| "serial".into()),
    );
    let benign_xml = vmplane_hypervisor::render_domain(&domain(&benign)).expect("benign renders");
    let (got, want) = (element_names(&xml), element_names(&benign_xml));
    // Labels may collapse (equal keys): compare with duplicates of <label> removed.
    let strip = |v: Vec<String>| -> Vec<String> {
        v.into_iter().filter(|n| !n.ends_with("label")).collect()
    };
    assert_eq!(
        strip(got),
        strip(want),
        "rendering {input:?} changed the element structure:\n{xml}"
    );
    // Metadata reads back what was written.
    let meta = vmplane_hypervisor::parse_metadata(&xml)
        .expect("metadata parses")
        .expect("vmplane metadata present");
    assert_eq!(
        (meta.name.as_str(), meta.namespace.as_str()),
        (input.0.as_str(), input.1.as_str())
    );
}

#[test]
fn domain_xml_hostile_values() {
    let nasty = [
        "</name><devices><disk/></devices><name>",
        "\"'><!-- x --><evil/>",
        "]]><![CDATA[<evil/>]]>",
        "&amp;&lt;&#0;&#x41;",
        "<?xml version='1.0'?><!DOCTYPE x [<!ENTITY e 'x'>]>&e;",
        "a\u{202e}b\u{feff}c\u{fffe}",
        "",
        "a\0b",
        "\r\n\t",
    ];
    let mut executions = 0;
    for a in nasty {
        for b in nasty {
            let input: DomainInput = (
                a.into(),
                b.into(),
                a.into(),
                format!("/tmp/{b}"),
                vec![(a.into(), b.into()), (b.into(), a.into())],
                Some(b.into()),
            );
            domain_property(&input);
            executions += 1;
        }
    }
    println!("fuzz domain XML: {executions} hostile combinations");
}

#[test]
fn domain_xml_random_values() {
    bolero::check!()
        .with_iterations(RANDOM_ITERATIONS * scale())
        .with_type::<DomainInput>()
        .for_each(domain_property);
}

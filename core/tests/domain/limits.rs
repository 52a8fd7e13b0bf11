//! Limits on input: size checked before parsing; YAML bombs and deep nesting rejected fast.

use std::time::{Duration, Instant};

use vmplane_core::limits::*;
use vmplane_core::types::{ParseError, parse_manifests};
use vmplane_core::{Category, Rejection, codes, validate};

use crate::support::*;

#[test]
fn a_manifest_over_the_byte_limit_is_rejected_before_parsing() {
    let mut big = b"apiVersion: kubevirt.io/v1\nkind: VirtualMachine\n# ".to_vec();
    big.resize(MANIFEST_BYTES_MAX + 1, b'x');
    let e = parse_manifests(&big).unwrap_err();
    assert_eq!(
        e,
        ParseError::TooLarge {
            bytes: MANIFEST_BYTES_MAX + 1,
            bytes_max: MANIFEST_BYTES_MAX
        }
    );
    assert_eq!(Rejection::from(e).category, Category::ResourceExhausted);
    // At the limit it is read (and fails only for being a comment-only non-manifest).
    let mut edge = b"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: k}\n# ".to_vec();
    edge.resize(MANIFEST_BYTES_MAX, b'x');
    assert!(parse_manifests(&edge).is_ok());
}

#[test]
fn billion_laughs_is_rejected_fast() {
    let bomb = r#"
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"#;
    let started = Instant::now();
    let e = parse_manifests(bomb.as_bytes()).unwrap_err();
    assert!(matches!(e, ParseError::TooComplex { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn moderate_alias_use_within_limits_still_parses() {
    let yaml = "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: k, labels: &l {a: b}, annotations: *l}\nspec: {}\n";
    assert!(parse_manifests(yaml.as_bytes()).is_ok());
}

#[test]
fn deep_nesting_is_rejected_fast() {
    let depth = 10_000;
    let yaml = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let started = Instant::now();
    let e = parse_manifests(yaml.as_bytes()).unwrap_err();
    assert!(
        matches!(e, ParseError::TooComplex { .. } | ParseError::Syntax { .. }),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // JSON too.
    let json = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
    assert!(parse_manifests(json.as_bytes()).is_err());
    // Over our own depth limit but under the parser's.
    let mut nested =
        String::from("apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: k}\nspec: ");
    nested.push_str(&"{a: ".repeat(MANIFEST_DEPTH_MAX));
    nested.push('1');
    nested.push_str(&"}".repeat(MANIFEST_DEPTH_MAX));
    let e = parse_manifests(nested.as_bytes()).unwrap_err();
    assert!(matches!(e, ParseError::TooComplex { .. }), "{e}");
}

#[test]
fn disk_count_limit_is_enforced_at_its_edge() {
    let with_disks = |n: usize| {
        let mut vm = small_vm("many", "Halted");
        let spec = vm.vmi_spec_mut();
        let disk = spec
            .domain
            .devices
            .as_ref()
            .unwrap()
            .disks
            .as_ref()
            .unwrap()[0]
            .clone();
        let vol = spec.volumes.as_ref().unwrap()[0].clone();
        let (mut disks, mut vols) = (Vec::new(), Vec::new());
        for i in 0..n {
            let mut d = disk.clone();
            d.name = format!("d{i}");
            disks.push(d);
            let mut v = vol.clone();
            v.name = format!("d{i}");
            vols.push(v);
        }
        spec.domain.devices_mut().disks = Some(disks);
        spec.volumes = Some(vols);
        vm
    };
    assert!(validate::vm(&with_disks(DISKS_MAX)).is_ok());
    let r = validate::vm(&with_disks(DISKS_MAX + 1)).unwrap_err();
    assert_eq!(r.category, Category::ResourceExhausted);
    assert!(r.has_code(codes::TOO_MANY));
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.template.spec.domain.devices.disks",
            "spec.template.spec.volumes"
        ],
        "{r}"
    );
}

#[test]
fn label_value_length_limit_is_enforced_at_its_edge() {
    let mut vm = small_vm("labels", "Halted");
    let labels = vm.metadata.labels.as_mut().unwrap();
    labels.insert("ok".into(), "x".repeat(LABEL_VALUE_BYTES_MAX).into());
    assert!(validate::vm(&vm).is_ok());
    vm.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("long".into(), "x".repeat(LABEL_VALUE_BYTES_MAX + 1).into());
    let r = validate::vm(&vm).unwrap_err();
    assert_eq!(r.causes[0].field, "metadata.labels.long");
}

//! Fields KubeVirt does not know are stored as written but warned of, as Kubernetes' API
//! server does with field validation `Warn` (`Warning: ... unknown field "spec.bogus"` on
//! stderr, exit status 0); a deprecated API version is warned of in KubeVirt's words; and
//! `get -o yaml` quotes every string a YAML 1.1 reader would take for something else, so its
//! output applies again unchanged.

use serde_json::Value;
use vmplane_tests::{Cli, kubevirt_testdata, vm_manifest};

use crate::shared_server;

/// The `Warning: ` lines of a command's stderr.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("Warning: "))
        .collect()
}

#[test]
fn misspelled_fields_are_stored_but_each_is_warned_of_by_its_path() {
    let cli = Cli::new(shared_server());
    let ns = "unknown-fields-vm";
    let manifest = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: typos
spec:
  bogus: 1
  runStrategy: Halted
  template:
    spec:
      terminationGracePeriodSecond: 0
      domain:
        memory:
          gest: 1Gi
          guest: 128Mi
        devices:
          disk:
          - name: a
          disks:
          - name: root
            dik: {}
      volumes:
      - name: root
        containerDisk:
          image: quay.io/containerdisks/fedora:40
";
    let (code, out, err) = cli.run_with_stdin(&["apply", "-n", ns, "-f", "-"], manifest);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("virtualmachine/typos created"), "{out}");
    assert_eq!(
        warnings(&err),
        [
            "Warning: virtualmachine/typos: unknown field \"spec.bogus\"",
            "Warning: virtualmachine/typos: unknown field \"spec.template.spec.terminationGracePeriodSecond\"",
            "Warning: virtualmachine/typos: unknown field \"spec.template.spec.domain.memory.gest\"",
            "Warning: virtualmachine/typos: unknown field \"spec.template.spec.domain.devices.disk\"",
            "Warning: virtualmachine/typos: unknown field \"spec.template.spec.domain.devices.disks[0].dik\"",
        ],
        "{err}"
    );
    // Stored as written (a KubeVirt user's manifest is never rewritten).
    let stored: Value =
        serde_json::from_str(&cli.ok(&["get", "vm", "typos", "-n", ns, "-o", "json"]))
            .expect("json");
    assert_eq!(stored["spec"]["bogus"], 1);
    assert_eq!(
        stored["spec"]["template"]["spec"]["domain"]["memory"]["gest"],
        "1Gi"
    );

    // Other kinds too: an instancetype's spec.
    let instancetype = "apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata:
  name: small
spec:
  bogus: 1
  cpu:
    guest: 1
  memory:
    guest: 128Mi
";
    let (code, out, err) = cli.run_with_stdin(&["apply", "-n", ns, "-f", "-"], instancetype);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(w[0].ends_with(": unknown field \"spec.bogus\""), "{err}");
}

#[test]
fn real_kubevirt_manifests_and_a_plain_vm_apply_without_a_warning() {
    let cli = Cli::new(shared_server());
    let ns = "unknown-fields-clean";
    let (code, out, err) = cli.run_with_stdin(
        &["apply", "-n", ns, "-f", "-"],
        &vm_manifest("plain", "128Mi"),
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(warnings(&err).is_empty(), "{err}");
    let dir = kubevirt_testdata();
    for file in [
        "examples/vm-cirros.yaml",
        "examples/vmi-fedora.yaml",
        "common-instancetypes/common-clusterpreferences-bundle.yaml",
    ] {
        let path = dir.join(file);
        let (code, out, err) = cli.run(&["apply", "-n", ns, "-f", path.to_str().expect("utf-8")]);
        assert_eq!(code, 0, "{file}\nstdout: {out}\nstderr: {err}");
        assert!(warnings(&err).is_empty(), "{file}: {err}");
    }
}

#[test]
fn a_deprecated_api_version_is_warned_of_in_kubevirts_words() {
    let cli = Cli::new(shared_server());
    let manifest = vm_manifest("old", "128Mi").replace("kubevirt.io/v1", "kubevirt.io/v1alpha3");
    let (code, out, err) =
        cli.run_with_stdin(&["apply", "-n", "unknown-fields-old", "-f", "-"], &manifest);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(
        warnings(&err),
        [
            "Warning: virtualmachine/old: kubevirt.io/v1alpha3 is now deprecated and will be removed in a future release."
        ],
        "{err}"
    );
}

#[test]
fn yaml_output_quotes_yaml11_booleans_and_applies_back_unchanged() {
    let cli = Cli::new(shared_server());
    let ns = "unknown-fields-yaml";
    let manifest = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: quoted
  labels:
    'on': 'no'
    flag: 'y'
    mode: 'Off'
    when: '2024-01-01'
  annotations:
    ok: 'yes'
    perm: '0777'
    ratio: '1:20'
    exp: '1e3'
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        memory:
          guest: 128Mi
";
    cli.apply_in(ns, manifest);
    let yaml = cli.ok(&["get", "vm", "quoted", "-n", ns, "-o", "yaml"]);
    for line in [
        "'on': 'no'",
        "flag: 'y'",
        "mode: 'Off'",
        "when: '2024-01-01'",
        "ok: 'yes'",
        "perm: '0777'",
        "ratio: '1:20'",
        "exp: '1e3'",
    ] {
        assert!(
            yaml.lines().any(|l| l.trim() == line),
            "{line} not in\n{yaml}"
        );
    }
    // What `get -o yaml` prints applies again as the same object.
    let (code, out, err) = cli.run_with_stdin(&["apply", "-n", ns, "-f", "-"], &yaml);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("virtualmachine/quoted unchanged"), "{out}");
}

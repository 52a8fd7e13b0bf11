//! KubeVirt's admission rules at `apply`, through the CLI: what KubeVirt's webhooks refuse (and
//! what vmplane would accept, then ignore or crash-loop on) is refused with its field path and
//! reason, and nothing is created; what KubeVirt accepts still applies.

use serde_json::Value;
use vmplane_tests::{Cli, Server, one_error_line};

use crate::shared_server;

/// The audit's minimal VM `q`, with `domain` lines added under the template's `domain:` and
/// `spec` lines under its `spec:` (each indented for its place).
fn vm(domain: &str, spec: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: q
spec:
  runStrategy: Halted
  template:
    spec:
{spec}      domain:
        memory: {{guest: 64Mi}}
        devices: {{}}
{domain}"
    )
}

fn apply(vmplane: &Cli, ns: &str, manifest: &str) -> (i32, String, String) {
    vmplane.run_with_stdin(&["apply", "-n", ns, "-f", "-"], manifest)
}

/// Applies `manifest` in `ns`, which must be refused with one error line naming every part
/// of `says`; nothing may be created.
#[track_caller]
fn refused(vmplane: &Cli, ns: &str, manifest: &str, says: &[&str]) -> String {
    let (code, out, err) = apply(vmplane, ns, manifest);
    assert_ne!(code, 0, "accepted: {out}");
    assert!(out.is_empty(), "{out}");
    let line = one_error_line(&err);
    for part in says {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    // The field is named once: the reason does not say it again.
    if let Some(field) = says.first().filter(|f| f.starts_with("spec.")) {
        assert_eq!(line.matches(&format!("{field}:")).count(), 1, "{line}");
        assert_eq!(line.matches(&format!("{field} ")).count(), 0, "{line}");
    }
    let (code, _, _) = vmplane.run(&["get", "vm", "q", "-n", ns]);
    assert_ne!(code, 0, "a refused VM must not exist");
    line
}

#[track_caller]
fn applied(vmplane: &Cli, ns: &str, manifest: &str) -> String {
    let (code, out, err) = apply(vmplane, ns, manifest);
    assert_eq!(code, 0, "refused: {err}");
    out
}

#[test]
fn kubevirt_spec_rules_are_refused_at_apply_with_their_field_paths() {
    let vmplane = Cli::new(shared_server());
    let ns = "kubevirt-admission-spec";
    let d = "spec.template.spec.domain";
    let cases: Vec<(String, Vec<String>)> = vec![
        (
            vm("        resources: {requests: {memory: -1Gi}}\n", ""),
            vec![
                format!("{d}.resources.requests.memory"),
                "must be greater than or equal to 0".into(),
            ],
        ),
        (
            vm("        resources: {limits: {cpu: -2}}\n", ""),
            vec![
                format!("{d}.resources.limits.cpu"),
                "must be greater than or equal to 0".into(),
            ],
        ),
        (
            vm("        resources: {limits: {memory: 32Mi}}\n", ""),
            vec![
                format!("{d}.memory.guest"),
                "must be equal to or less than the memory limit".into(),
            ],
        ),
        (
            vm(
                "        resources: {requests: {memory: 128Mi}, limits: {memory: 100Mi}}\n",
                "",
            ),
            vec![
                format!("{d}.resources.requests.memory"),
                "is greater than".into(),
            ],
        ),
        (
            vm(
                "        resources: {requests: {cpu: '2'}, limits: {cpu: '1'}}\n",
                "",
            ),
            vec![format!("{d}.resources.requests.cpu"), "is greater than".into()],
        ),
        (
            vm("        firmware: {serial: 'a b'}\n", ""),
            vec![
                format!("{d}.firmware.serial"),
                "[A-Za-z0-9_.+-]".into(),
            ],
        ),
        (
            vm("        machine: {type: pc-i440fx-8.0}\n", ""),
            vec![
                format!("{d}.machine.type"),
                "not supported by vmplane".into(),
            ],
        ),
        (
            "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: q}
spec:
  runStrategy: Halted
  template:
    spec:
      networks: [{name: default, pod: {}}]
      domain:
        memory: {guest: 64Mi}
        devices:
          interfaces: [{name: default, masquerade: {}, model: fancy}]
"
            .into(),
            vec![
                format!("{d}.devices.interfaces[0].model"),
                "uses model \"fancy\" that is not supported".into(),
            ],
        ),
        (
            vm("", "      hostname: Not_A_Label\n"),
            vec![
                "spec.template.spec.hostname".into(),
                "DNS_LABEL".into(),
            ],
        ),
        (
            "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: q}
spec:
  runStrategy: Halted
  template: {spec: {domain: {devices: {}}}}
"
            .into(),
            vec![
                format!("{d}.memory.guest"),
                "no memory requested".into(),
            ],
        ),
        (
            vm("", "      startStrategy: Paused\n"),
            vec![
                "spec.template.spec.startStrategy".into(),
                "not supported by vmplane".into(),
            ],
        ),
        (
            vm(
                "",
                "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: zone, operator: In, values: [nowhere]}]
",
            ),
            vec![
                "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                    .into(),
                "nodeSelector".into(),
            ],
        ),
    ];
    for (manifest, says) in &cases {
        let says: Vec<&str> = says.iter().map(String::as_str).collect();
        refused(&vmplane, ns, manifest, &says);
    }
    // What KubeVirt accepts still applies: a request above the guest memory, a pc-q35 machine,
    // preferred (not required) affinity.
    let out = applied(
        &vmplane,
        ns,
        &vm(
            "        resources: {requests: {memory: 1Gi}}\n        machine: {type: pc-q35-8.0}\n",
            "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 1
            preference: {matchExpressions: [{key: zone, operator: In, values: [a]}]}
",
        ),
    );
    assert_eq!(out, "virtualmachine/q created\n");
}

#[test]
fn labels_annotations_and_generate_name_are_checked_at_apply() {
    let vmplane = Cli::new(shared_server());
    let ns = "kubevirt-admission-meta";
    let with_meta = |meta: &str| vm("", "").replace("metadata:\n  name: q\n", meta);
    refused(
        &vmplane,
        ns,
        &with_meta("metadata:\n  name: q\n  labels: {'bad key': x}\n"),
        &["metadata.labels.bad key", "Invalid value: \"bad key\""],
    );
    refused(
        &vmplane,
        ns,
        &with_meta("metadata:\n  name: q\n  labels: {tier: 'not a value'}\n"),
        &["metadata.labels.tier", "Invalid value: \"not a value\""],
    );
    refused(
        &vmplane,
        ns,
        &with_meta("metadata:\n  name: q\n  annotations: {'-x-/y': z}\n"),
        &["metadata.annotations.-x-/y"],
    );
    refused(
        &vmplane,
        ns,
        &vm("", "").replace(
            "  template:\n    spec:\n",
            "  template:\n    metadata: {labels: {app: '-x'}}\n    spec:\n",
        ),
        &["spec.template.metadata.labels.app"],
    );
    refused(
        &vmplane,
        ns,
        &with_meta("metadata:\n  generateName: q-\n"),
        &[
            "metadata.generateName",
            "cannot use generate name with apply",
        ],
    );
    // `vmplane label` says the same of the same key (one rule).
    applied(&vmplane, ns, &vm("", ""));
    let line = vmplane.fails(&["label", "vm", "q", "-n", ns, "bad key=x"]);
    assert!(line.contains("bad key"), "{line}");
}

#[test]
fn an_upper_case_firmware_uuid_applies_once_then_is_unchanged() {
    let vmplane = Cli::new(shared_server());
    let ns = "kubevirt-admission-uuid";
    let manifest = vm(
        "        firmware: {uuid: 6A1A24A1-4061-4607-8BF4-A3963D0C5895}\n",
        "",
    );
    assert_eq!(
        applied(&vmplane, ns, &manifest),
        "virtualmachine/q created\n"
    );
    for _ in 0..2 {
        assert_eq!(
            applied(&vmplane, ns, &manifest),
            "virtualmachine/q unchanged\n"
        );
    }
    let got: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "q", "-n", ns, "-o", "json"])).unwrap();
    assert_eq!(got["metadata"]["generation"], 1);
}

#[test]
fn a_revision_name_is_refused_and_not_silently_replaced() {
    let vmplane = Cli::new(shared_server());
    let ns = "kubevirt-admission-rev";
    applied(
        &vmplane,
        ns,
        "apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata: {name: small}
spec: {cpu: {guest: 1}, memory: {guest: 64Mi}}
",
    );
    let manifest = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: q}
spec:
  runStrategy: Halted
  instancetype: {kind: VirtualMachineInstancetype, name: small, revisionName: q-small-v1beta1-0444161e-1}
  template: {spec: {domain: {devices: {}}}}
";
    refused(
        &vmplane,
        ns,
        manifest,
        &[
            "spec.instancetype.revisionName",
            "not supported by vmplane: vmplane captures the revision at creation, see status.instancetypeRef.revision",
        ],
    );
    // Without it the VM takes the revision captured now.
    applied(
        &vmplane,
        ns,
        &manifest.replace(", revisionName: q-small-v1beta1-0444161e-1", ""),
    );
}

#[test]
fn kubevirt_io_v1alpha3_applies_as_v1() {
    let vmplane = Cli::new(shared_server());
    let ns = "kubevirt-admission-v1alpha3";
    let v1 = vm("", "");
    let old = v1.replace("kubevirt.io/v1", "kubevirt.io/v1alpha3");
    assert_eq!(applied(&vmplane, ns, &old), "virtualmachine/q created\n");
    let got: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "q", "-n", ns, "-o", "json"])).unwrap();
    assert_eq!(got["apiVersion"], "kubevirt.io/v1");
    // The same VM written in v1 is the same object.
    assert_eq!(applied(&vmplane, ns, &v1), "virtualmachine/q unchanged\n");
}

/// kubevirt.md §6: a Discontinued gate listed in the KubeVirt CR plus a template using its API
/// refuses the VM's creation with the gate's message (core's `features::check_vm_discontinued`,
/// given the cluster's features by the command path); once the gate is no longer listed, the
/// same VM is created.
#[test]
fn a_listed_discontinued_gate_refuses_a_vm_using_its_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let vmplane = Cli::new(&server);
    let config = |gates: &str| {
        format!(
            "apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {{name: kubevirt, namespace: kubevirt}}
spec:
  configuration:
    developerConfiguration: {{featureGates: [{gates}]}}
"
        )
    };
    let macvtap_vm = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: q}
spec:
  runStrategy: Halted
  template:
    spec:
      networks: [{name: net, multus: {networkName: n}}]
      domain:
        memory: {guest: 64Mi}
        devices:
          interfaces: [{name: net, macvtap: {}}]
";
    applied(&vmplane, "kubevirt", &config("Macvtap"));
    refused(
        &vmplane,
        "default",
        macvtap_vm,
        &[
            "spec.template.spec.domain.devices.interfaces[0].macvtap",
            "Macvtap network binding is discontinued since v1.3",
        ],
    );
    applied(&vmplane, "kubevirt", &config(""));
    applied(&vmplane, "default", macvtap_vm);
}

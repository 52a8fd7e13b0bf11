//! Why a VMI did not run, as the operations audit asked for it with the real binary on
//! libvirt's test driver (`serve --hypervisor test:///ABS/node.xml`): a VM whose domain libvirt
//! refuses says why in its `Failure` condition, `describe` and `history` (not only in the
//! server's log), a standalone VMI says why in its status, and a standalone VMI that fits on
//! no node says so as a VM's VMI does (message and `Ready=False`/`Unschedulable`).

use std::path::Path;

use serde_json::Value;
use vmplane_tests::{Cli, Server, kubevirt_testdata, wait_for};

/// The reconciler acts on the write's wake-up; a few passes at most.
const PASSES_MS: u64 = 30_000;

/// UUIDs of domains the node file defines outside vmplane (no vmplane metadata): a VMI given
/// one as its firmware UUID cannot be defined there.
const SQUATTED_VM_UUID: &str = "6695eb01-f6a4-8304-79aa-97f2502e2001";
const SQUATTED_VMI_UUID: &str = "6695eb01-f6a4-8304-79aa-97f2502e2002";

/// Writes the test driver's node file into `dir`; returns `--hypervisor`'s value.
fn node_file(dir: &Path, xml: &str) -> String {
    let path = dir.join("node.xml");
    std::fs::write(&path, xml).expect("write the test driver's node file");
    format!("node1=test://{}", path.display())
}

fn squatter(name: &str, uuid: &str) -> String {
    format!(
        "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory>65536</memory>\
         <vcpu>1</vcpu><os><type>hvm</type></os></domain>"
    )
}

fn apply(cli: &Cli, yaml: &str) {
    let (code, out, err) = cli.run_with_stdin(&["apply", "-f", "-"], yaml);
    assert_eq!(code, 0, "apply failed\nstdout: {out}\nstderr: {err}");
}

fn json_of(cli: &Cli, kind: &str, name: &str) -> Option<Value> {
    let (code, out, _) = cli.run(&["get", kind, name, "-o", "json"]);
    (code == 0).then(|| serde_json::from_str(&out).expect("JSON"))
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// Audit: `spec.runStrategy: Always` and a domain that cannot be defined showed
/// `CrashLoopBackOff` with "1 VMI(s) in a row ended before running; next start in 9 s", and
/// `describe` nothing more; the cause was in the server's log only.
#[test]
fn a_domain_libvirt_refuses_is_explained_in_status_describe_and_history() {
    let dir = tempfile::tempdir().expect("temp dir");
    let hypervisor = node_file(
        dir.path(),
        &format!(
            "<node>{}{}</node>",
            squatter("squatter-a", SQUATTED_VM_UUID),
            squatter("squatter-b", SQUATTED_VMI_UUID)
        ),
    );
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", &hypervisor]);
    let cli = Cli::new(&server);
    apply(
        &cli,
        &format!(
            "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: refused}}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        firmware: {{uuid: {SQUATTED_VM_UUID}}}
        memory: {{guest: 64Mi}}
        devices: {{}}
"
        ),
    );
    apply(
        &cli,
        &format!(
            "apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {{name: refused-vmi}}
spec:
  domain:
    firmware: {{uuid: {SQUATTED_VMI_UUID}}}
    memory: {{guest: 64Mi}}
    devices: {{}}
"
        ),
    );

    // The VM: its Failure condition names the cause.
    let vm = wait_for(
        "the VM to crash-loop",
        PASSES_MS,
        || {
            json_of(&cli, "vm", "refused")
                .filter(|vm| vm["status"]["printableStatus"] == "CrashLoopBackOff")
        },
        || server.stderr(),
    );
    let failure = condition(&vm, "Failure").expect("a Failure condition");
    let message = failure["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("1 VMI(s) in a row ended before running: DomainDefineFailed: ")
            && message.contains("squatter-a")
            && message.contains("not managed by vmplane")
            && message.contains("; next start in "),
        "{vm}"
    );
    // describe shows it twice: in the status, and in the event that recorded it.
    let described = cli.ok(&["describe", "vm", "refused"]);
    assert!(
        described.contains("ended before running: DomainDefineFailed: "),
        "{described}"
    );
    assert!(
        described.contains("Failed (DomainDefineFailed: "),
        "{described}"
    );
    // history: the row of the failure says why.
    let history: Value =
        serde_json::from_str(&cli.ok(&["history", "vm", "refused", "-o", "json"])).expect("JSON");
    let rows = history.as_array().expect("rows");
    assert!(
        rows.iter().any(|r| {
            let summary = r["summary"].as_str().unwrap_or_default();
            summary.contains("Failed (DomainDefineFailed: ")
                && summary.contains("not managed by vmplane")
        }),
        "{history}"
    );

    // The standalone VMI: Failed, its status and Ready condition say why.
    let vmi = wait_for(
        "the standalone VMI to fail",
        PASSES_MS,
        || json_of(&cli, "vmi", "refused-vmi").filter(|v| v["status"]["phase"] == "Failed"),
        || server.stderr(),
    );
    let status = &vmi["status"];
    assert_eq!(status["reason"], "DomainDefineFailed", "{vmi}");
    let said = status["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("squatter-b") && said.contains("not managed by vmplane"),
        "{vmi}"
    );
    let ready = condition(&vmi, "Ready").expect("a Ready condition");
    assert_eq!(
        (&ready["status"], &ready["reason"], &ready["message"]),
        (
            &Value::from("False"),
            &Value::from("DomainDefineFailed"),
            &Value::from(said)
        ),
        "{vmi}"
    );
    let described = cli.ok(&["describe", "vmi", "refused-vmi"]);
    assert!(described.contains("not managed by vmplane"), "{described}");
}

/// Audit: `vmi-fedora` (the KubeVirt example) on a node without room for it showed
/// `{phase: Scheduling, reason: Unschedulable}` with no message and no conditions, while a
/// VM's VMI in the same place said `no node has … free` with `Ready=False`/`Unschedulable`.
#[test]
fn a_standalone_vmi_that_fits_nowhere_says_why_as_a_vm_s_vmi_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    // 512 MiB: vmi-fedora asks for 1024M.
    let hypervisor = node_file(
        dir.path(),
        "<node><cpu><mhz>2000</mhz><model>i686</model><active>2</active><nodes>1</nodes>\
         <sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>\
         <memory>524288</memory></node>",
    );
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", &hypervisor]);
    let cli = Cli::new(&server);
    let fedora = kubevirt_testdata().join("examples/vmi-fedora.yaml");
    cli.ok(&["apply", "-f", fedora.to_str().expect("a UTF-8 path")]);
    apply(
        &cli,
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: fedora-vm}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 1024M}
        devices: {}
",
    );
    let unschedulable = |kind: &'static str, name: &'static str| {
        wait_for(
            &format!("{kind} {name} to be unschedulable"),
            PASSES_MS,
            || json_of(&cli, kind, name).filter(|v| v["status"]["reason"] == "Unschedulable"),
            || server.stderr(),
        )
    };
    let standalone = unschedulable("vmi", "vmi-fedora");
    let owned = unschedulable("vmi", "fedora-vm");
    let status = &standalone["status"];
    assert_eq!(status["phase"], "Scheduling", "{standalone}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("no node has 1 vCPUs and 1024000000 bytes of memory free"),
        "{standalone}"
    );
    let ready = condition(&standalone, "Ready").expect("a Ready condition");
    assert_eq!(
        (&ready["status"], &ready["reason"], &ready["message"]),
        (
            &Value::from("False"),
            &Value::from("Unschedulable"),
            &Value::from(message)
        ),
        "{standalone}"
    );
    // The same words as the VM's VMI: one rule for both.
    for key in ["phase", "reason", "message", "conditions"] {
        assert_eq!(
            owned["status"][key], status[key],
            "{key}: {owned}\n{standalone}"
        );
    }
}

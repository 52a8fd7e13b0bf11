//! `apply -f` (and `import -f`) send an input's objects in dependency order, whatever order the
//! input has them in: the cluster config, then instancetypes and preferences, then VMs and
//! VMIs, then snapshots, restores and clones, each class in the input's order. A VM whose
//! instancetype comes later in the same file (or in a file named after it in a directory, or
//! in a later `-f`) is created, as kubectl with KubeVirt creates it. `-f` may be repeated.

use serde_json::Value;
use vmplane_tests::{Cli, kubevirt_testdata, one_error_line};

use crate::shared_server;

/// A VM named `name` whose instancetype is the namespaced `instancetype`.
fn vm_of(name: &str, instancetype: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  instancetype: {{kind: VirtualMachineInstancetype, name: {instancetype}}}
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {{}}
"
    )
}

/// A namespaced instancetype named `name`.
fn instancetype(name: &str) -> String {
    format!(
        "apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata:
  name: {name}
spec:
  cpu: {{guest: 1}}
  memory: {{guest: 128Mi}}
"
    )
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("JSON")
}

#[test]
fn a_vm_before_its_instancetype_in_one_file_is_created_after_it() {
    let vmplane = Cli::new(shared_server());
    let ns = "apply-order-file";
    let file = format!(
        "{}---\n{}",
        vm_of("ordervm", "ordit"),
        instancetype("ordit")
    );
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns], &file);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "virtualmachineinstancetype/ordit created\nvirtualmachine/ordervm created\n",
            ""
        )
    );
    let vm = json(&vmplane.ok(&["get", "vm", "ordervm", "-n", ns, "-o", "json"]));
    assert_eq!(vm["status"]["instancetypeRef"]["name"], "ordit", "{vm}");
    // Again: each unchanged, in the same order.
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns], &file);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "virtualmachineinstancetype/ordit unchanged\nvirtualmachine/ordervm unchanged\n",
            ""
        )
    );
    // -o json: a List of the objects in the order they were written.
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "-o", "json"], &file);
    assert_eq!(code, 0, "{err}");
    let kinds: Vec<String> = json(&out)["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(kinds, ["VirtualMachineInstancetype", "VirtualMachine"]);
    // import orders alike.
    let ns2 = "apply-order-import";
    let (code, out, err) = vmplane.run_with_stdin(&["import", "-f", "-", "-n", ns2], &file);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "virtualmachineinstancetype/ordit created\nvirtualmachine/ordervm created\n",
            ""
        )
    );
    // --help says that vmplane orders by kind.
    for command in ["apply", "import"] {
        let help = vmplane_tests::run_cli(&[command, "--help"]).1;
        assert!(help.contains("ordered by kind"), "{command}: {help}");
    }
}

#[test]
fn every_kind_is_sent_in_dependency_order_each_class_in_the_inputs_order() {
    // A server of its own: the cluster config changes what every VM of a server may use.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = vmplane_tests::Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let vmplane = Cli::new(&server);
    let kubevirt = "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  \
                    namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      \
                    featureGates: [Snapshot]\n";
    let snapshot = "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\n\
                    metadata: {name: s1}\nspec:\n  source: {apiGroup: kubevirt.io, kind: \
                    VirtualMachine, name: v1}\n";
    let preference = "apiVersion: instancetype.kubevirt.io/v1beta1\nkind: \
                      VirtualMachineClusterPreference\nmetadata: {name: p1}\nspec: {}\n";
    let file = [
        snapshot,
        &vm_of("v1", "i1"),
        &vm_of("v2", "i2"),
        kubevirt,
        &instancetype("i2"),
        preference,
        &instancetype("i1"),
    ]
    .join("---\n");
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &file);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out,
        "kubevirt/kubevirt created\n\
         virtualmachineinstancetype/i2 created\n\
         virtualmachineclusterpreference/p1 created\n\
         virtualmachineinstancetype/i1 created\n\
         virtualmachine/v1 created\n\
         virtualmachine/v2 created\n\
         virtualmachinesnapshot/s1 created\n",
        "{err}"
    );
    // A refused object is still named by its place in the input, not by its turn.
    let bad = vm_of("v3", "i3").replace("runStrategy: Halted", "runStrategy: Sometimes");
    let file = format!("{bad}---\n{}", instancetype("i3"));
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &file);
    assert_ne!(code, 0);
    assert_eq!(out, "virtualmachineinstancetype/i3 created\n");
    let line = one_error_line(&err);
    assert!(
        line.contains("VirtualMachine default/v3: document 1: spec.runStrategy"),
        "{line}"
    );
}

#[test]
fn a_directory_or_several_files_apply_a_vm_whose_preference_file_sorts_after_it() {
    let vmplane = Cli::new(shared_server());
    let examples = kubevirt_testdata().join("examples");
    let dir = tempfile::tempdir().expect("tempdir");
    for name in [
        "vm-cirros-clarge-windows.yaml",
        "clarge.yaml",
        "windows.yaml",
    ] {
        std::fs::copy(examples.join(name), dir.path().join(name)).expect("copy an example");
    }
    // As it is, KubeVirt refuses the example's VM (memory.guest beside an instancetype's, the
    // test data's negative case): so does vmplane, once its preference exists, which a
    // preference file sorting after it used to keep it from seeing.
    let ns = "apply-order-dir-as-is";
    let (code, out, err) = vmplane.run(&["apply", "-f", path(dir.path()), "-n", ns]);
    assert_ne!(code, 0);
    assert_eq!(
        out,
        "virtualmachineinstancetype/clarge created
virtualmachinepreference/windows created
"
    );
    let line = one_error_line(&err);
    assert!(
        line.contains(
            "spec.template.spec.domain.memory.guest conflicts with selected instance type"
        ),
        "{line}"
    );
    // Without memory.guest (as before KubeVirt's memory default, the test data's positive
    // variants), it is created after its instancetype and preference.
    let vm_file = dir.path().join("vm-cirros-clarge-windows.yaml");
    let text = std::fs::read_to_string(&vm_file).expect("read");
    let memory = "        memory:\n          guest: 128Mi\n";
    assert!(text.contains(memory), "{text}");
    std::fs::write(&vm_file, text.replace(memory, "")).expect("write");
    let ns = "apply-order-dir";
    let (code, out, err) = vmplane.run(&["apply", "-f", path(dir.path()), "-n", ns]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "virtualmachineinstancetype/clarge created\n\
             virtualmachinepreference/windows created\n\
             virtualmachine/vm-cirros-clarge-windows created\n",
            ""
        )
    );

    // The same files, each named with -f, the VM's first: one input, ordered as one.
    let ns = "apply-order-files";
    let files: Vec<String> = [
        "vm-cirros-clarge-windows.yaml",
        "clarge.yaml",
        "windows.yaml",
    ]
    .iter()
    .map(|n| path(&dir.path().join(n)).to_owned())
    .collect();
    let mut args = vec!["apply", "-n", ns];
    for f in &files {
        args.extend(["-f", f.as_str()]);
    }
    let (code, out, err) = vmplane.run(&args);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "virtualmachineinstancetype/clarge created\n\
             virtualmachinepreference/windows created\n\
             virtualmachine/vm-cirros-clarge-windows created\n",
            ""
        )
    );
    // --filename too, and import.
    let (code, out, err) = vmplane.run(&[
        "import",
        "-n",
        ns,
        "--filename",
        &files[0],
        "-f",
        &files[1],
        "--filename",
        &files[2],
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
}

#[test]
fn several_files_name_the_file_of_a_refused_object() {
    let vmplane = Cli::new(shared_server());
    let ns = "apply-order-named";
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
    std::fs::write(&a, instancetype("named-it")).expect("write");
    std::fs::write(
        &b,
        format!(
            "{}---\n{}",
            vm_of("good", "named-it"),
            vm_of("bad", "named-it").replace("runStrategy: Halted", "runStrategy: Sometimes")
        ),
    )
    .expect("write");
    let (code, out, err) = vmplane.run(&["apply", "-f", path(&b), "-f", path(&a), "-n", ns]);
    assert_ne!(code, 0);
    assert_eq!(
        out,
        "virtualmachineinstancetype/named-it created\nvirtualmachine/good created\n"
    );
    let line = one_error_line(&err);
    assert!(
        line.contains(&format!(
            "VirtualMachine {ns}/bad: {}: document 2: spec.runStrategy",
            path(&b)
        )),
        "{line}"
    );
    // delete -f takes several too, each object in the input's order.
    assert_eq!(
        vmplane.ok(&[
            "delete",
            "-f",
            path(&a),
            "-f",
            path(&b),
            "-n",
            ns,
            "--ignore-not-found"
        ]),
        "virtualmachineinstancetype/named-it deleted\nvirtualmachine/good deleted\n"
    );
    // Standard input once at most: it cannot be read twice.
    let line = vmplane.fails(&["apply", "-f", "-", "-f", "-", "-n", ns]);
    assert!(line.contains("-f -") && line.contains("once"), "{line}");
    // expand takes -f more than once too, and still one VM in all.
    let line = vmplane.fails(&["expand", "-f", path(&a), "-f", path(&b), "-n", ns]);
    assert!(
        line.contains("expand takes exactly one VirtualMachine, found 3 objects"),
        "{line}"
    );
}

#[test]
fn a_dry_run_says_which_vm_it_could_not_check_against_an_instancetype_of_the_same_input() {
    let vmplane = Cli::new(shared_server());
    let ns = "apply-order-dry";
    let file = format!("{}---\n{}", vm_of("dryvm", "dryit"), instancetype("dryit"));
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "--dry-run"], &file);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(err, "");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0],
        "virtualmachineinstancetype/dryit created (dry run)"
    );
    assert!(
        lines[1].starts_with("virtualmachine/dryvm not checked (dry run): ")
            && lines[1].contains("spec.instancetype.name")
            && lines[1].contains("dryit")
            && lines[1].contains("document 2"),
        "{out}"
    );
    // Nothing was written.
    for (kind, name) in [("vm", "dryvm"), ("instancetype", "dryit")] {
        let line = vmplane.fails(&["get", kind, name, "-n", ns]);
        assert!(line.contains("not found"), "{line}");
    }
    // -o name and -o json print the objects that were checked; the VM that was not is said on
    // stderr, not printed as if it had been.
    let (code, out, err) = vmplane.run_with_stdin(
        &["apply", "-f", "-", "-n", ns, "--dry-run", "-o", "name"],
        &file,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "virtualmachineinstancetype/dryit\n");
    assert!(
        err.starts_with("vmplane: warning: ") && err.contains("dryvm") && err.lines().count() == 1,
        "{err}"
    );

    // What the apply itself would refuse is refused by its dry run too: an instancetype that
    // is in no input, a VM that is wrong whatever its instancetype, a VM whose instancetype in
    // the input is refused itself.
    let missing = vm_of("dryvm2", "nowhere");
    let (code, _, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "--dry-run"], &missing);
    assert_ne!(code, 0);
    assert!(
        one_error_line(&err).contains("\"nowhere\" not found"),
        "{err}"
    );
    let wrong = format!(
        "{}---\n{}",
        vm_of("dryvm3", "dryit3").replace("runStrategy: Halted", "runStrategy: Sometimes"),
        instancetype("dryit3")
    );
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "--dry-run"], &wrong);
    assert_ne!(code, 0);
    assert_eq!(out, "virtualmachineinstancetype/dryit3 created (dry run)\n");
    assert!(one_error_line(&err).contains("spec.runStrategy"), "{err}");
    let refused = format!(
        "{}---\n{}",
        vm_of("dryvm4", "dryit4"),
        instancetype("dryit4").replace("guest: 128Mi", "guest: 128Mx")
    );
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "--dry-run"], &refused);
    assert_ne!(code, 0);
    assert_eq!(out, "");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(lines[0].contains("128Mx"), "{err}");
    assert!(lines[1].contains("\"dryit4\" not found"), "{err}");
}

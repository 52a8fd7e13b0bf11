//! What `apply -f` (and `import -f`, `expand -f`, `delete -f`) reads, as kubectl reads it: a
//! `List` (what `get -o yaml` prints) item by item, a directory file by file, and an object in
//! another namespace than an explicit `-n` refused.

use serde_json::Value;
use vmplane_tests::{Cli, one_error_line, repo_root};

use crate::shared_server;

/// examples/vm.yaml named `name`.
fn vm(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("examples/vm.yaml"))
        .expect("read examples/vm.yaml")
        .replace("name: demo", &format!("name: {name}"))
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

#[test]
fn a_listed_get_applies_again_item_by_item_as_unchanged() {
    let vmplane = Cli::new(shared_server());
    let ns = "files-list";
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["a", "b"] {
        let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns], &vm(name));
        assert_eq!(code, 0, "{err}");
    }
    // The list as `get` prints it, status and resourceVersions included, in YAML and JSON.
    for format in ["yaml", "json"] {
        let file = dir.path().join(format!("list.{format}"));
        let listed = vmplane.ok(&["get", "vms", "-n", ns, "-o", format]);
        std::fs::write(&file, &listed).expect("write the list");
        assert_eq!(
            vmplane.ok(&["apply", "-f", path(&file), "-n", ns]),
            "virtualmachine/a unchanged\nvirtualmachine/b unchanged\n",
            "{format}"
        );
    }
    // Items are applied in order; a refused one is named by its place and its name, the
    // others still applied.
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n{}{}",
        indent_item(&vm("c")),
        indent_item(&vm("bad").replace("runStrategy: Manual", "runStrategy: Sometimes")),
    );
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns], &list);
    assert_ne!(code, 0);
    assert_eq!(out, "virtualmachine/c created\n");
    let line = one_error_line(&err);
    assert!(
        line.contains("VirtualMachine files-list/bad: document 1: items[1]: spec.runStrategy"),
        "{line}"
    );
    // A list of one VM expands like the VM.
    let one = format!(
        "apiVersion: v1\nkind: List\nitems:\n{}",
        indent_item(&vm("c"))
    );
    let (code, out, err) =
        vmplane.run_with_stdin(&["expand", "-f", "-", "-n", ns, "-o", "json"], &one);
    assert_eq!(code, 0, "{err}");
    let expanded: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(expanded["metadata"]["name"], "c");
}

/// A YAML document as an item of a block list (`- ` then the document indented).
fn indent_item(doc: &str) -> String {
    let mut out = String::new();
    for (i, line) in doc
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .enumerate()
    {
        out.push_str(if i == 0 { "- " } else { "  " });
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[test]
fn a_directory_applies_its_manifest_files_in_name_order_and_subdirectories_only_with_r() {
    let vmplane = Cli::new(shared_server());
    let ns = "files-dir";
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::write(root.join("b.yml"), vm("b")).expect("write");
    std::fs::write(
        root.join("a.yaml"),
        format!("{}---\n{}", vm("a1"), vm("a2")),
    )
    .expect("write");
    let c: Value = serde_yaml::from_str(&vm("c")).expect("YAML");
    std::fs::write(root.join("c.json"), c.to_string()).expect("write");
    std::fs::write(root.join("notes.txt"), "not a manifest").expect("write");
    std::fs::create_dir(root.join("sub")).expect("mkdir");
    std::fs::write(root.join("sub/d.yaml"), vm("d")).expect("write");
    assert_eq!(
        vmplane.ok(&["apply", "-f", path(root), "-n", ns]),
        "virtualmachine/a1 created\nvirtualmachine/a2 created\nvirtualmachine/b created\n\
         virtualmachine/c created\n"
    );
    assert_eq!(
        vmplane.ok(&["apply", "-f", path(root), "-R", "-n", ns]),
        "virtualmachine/a1 unchanged\nvirtualmachine/a2 unchanged\nvirtualmachine/b unchanged\n\
         virtualmachine/c unchanged\nvirtualmachine/d created\n"
    );
    // A directory without manifests is one line saying so.
    let empty = tempfile::tempdir().expect("tempdir");
    let line = vmplane.fails(&["apply", "-f", path(empty.path()), "-n", ns]);
    assert!(
        line.contains(&format!(
            "-f {}: no .yaml, .yml or .json file",
            path(empty.path())
        )),
        "{line}"
    );
    // An error about a file's object names the file.
    std::fs::write(
        root.join("e.yaml"),
        "kind: VirtualMachine\nmetadata: {name: e}\n",
    )
    .expect("write");
    let (code, _, err) = vmplane.run(&["apply", "-f", path(root), "-n", ns]);
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    assert!(
        line.contains(&format!(
            "{}: document 1: apiVersion: Required value",
            path(&root.join("e.yaml"))
        )),
        "{line}"
    );
    // --help says so, with an example.
    let help = vmplane_tests::run_cli(&["apply", "--help"]).1;
    assert!(help.contains("vmplane apply -f manifests/"), "{help}");
}

#[test]
fn an_object_in_another_namespace_than_an_explicit_n_is_refused_as_kubectl_refuses_it() {
    let vmplane = Cli::new(shared_server());
    let (mine, theirs) = ("files-ns-mine", "files-ns-theirs");
    let elsewhere = vm("x").replace(
        "  name: x\n",
        &format!("  name: x\n  namespace: {theirs}\n"),
    );
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-", "-n", mine], &elsewhere);
    assert_ne!(code, 0);
    assert_eq!(out, "");
    assert_eq!(
        one_error_line(&err),
        format!(
            "vmplane: error: VirtualMachine {theirs}/x: metadata.namespace: the namespace from \
             the provided object \"{theirs}\" does not match the namespace \"{mine}\". You must \
             pass '--namespace={theirs}' to perform this operation."
        )
    );
    let line = vmplane.fails(&["get", "vm", "x", "-n", theirs]);
    assert!(line.contains("not found"), "nothing was written: {line}");
    // The same -n as the object's, or no -n at all: the object's namespace.
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &elsewhere);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/x created\n"),
        "{err}"
    );
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "--namespace", theirs], &elsewhere);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/x unchanged\n"),
        "{err}"
    );
    // Cluster-scoped kinds have no namespace to differ.
    let cluster = "apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterInstancetype
metadata:
  name: files-ns-small
  namespace: somewhere
spec:
  cpu: {guest: 1}
  memory: {guest: 128Mi}
";
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-", "-n", mine], cluster);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            "virtualmachineclusterinstancetype/files-ns-small created\n"
        ),
        "{err}"
    );
}

#[test]
fn delete_f_deletes_what_apply_f_wrote_and_says_which_object_was_not_there() {
    let vmplane = Cli::new(shared_server());
    let ns = "files-delete";
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("vms.yaml");
    std::fs::write(&file, format!("{}---\n{}", vm("a"), vm("b"))).expect("write");
    vmplane.ok(&["apply", "-f", path(&file), "-n", ns]);
    assert_eq!(
        vmplane.ok(&["delete", "-f", path(&file), "-n", ns]),
        "virtualmachine/a deleted\nvirtualmachine/b deleted\n"
    );
    let (code, out, err) = vmplane.run(&["get", "vms", "-n", ns]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");

    // Again: each object is not found, named with its place in the file, and counted.
    let (code, out, err) = vmplane.run(&["delete", "-f", path(&file), "-n", ns]);
    assert_ne!(code, 0, "{out}");
    assert_eq!(out, "");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].contains(&format!("VirtualMachine {ns}/a: document 1: "))
            && lines[0].contains("not found"),
        "{err}"
    );
    assert!(
        lines[1].contains(&format!("VirtualMachine {ns}/b: document 2: ")),
        "{err}"
    );
    assert_eq!(
        lines[2], "vmplane: error: 2 of 2 objects not deleted",
        "{err}"
    );
    // Unless a missing object is fine.
    let (code, out, err) =
        vmplane.run(&["delete", "-f", path(&file), "-n", ns, "--ignore-not-found"]);
    assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""));

    // The single form takes --ignore-not-found and -o name too.
    vmplane.ok(&["apply", "-f", path(&file), "-n", ns]);
    assert_eq!(
        vmplane.ok(&["delete", "vm", "a", "-n", ns, "-o", "name"]),
        "virtualmachine/a\n"
    );
    assert_eq!(
        vmplane.ok(&["delete", "vm", "a", "-n", ns, "--ignore-not-found"]),
        ""
    );
    // With -n, an object of the file in another namespace is refused, as apply refuses it.
    let elsewhere = dir.path().join("elsewhere.yaml");
    std::fs::write(
        &elsewhere,
        vm("b").replace(
            "  name: b\n",
            "  name: b\n  namespace: files-delete-other\n",
        ),
    )
    .expect("write");
    let line = one_error_line(&vmplane.fails(&["delete", "-f", path(&elsewhere), "-n", ns]));
    assert!(line.contains("does not match the namespace"), "{line}");
    assert!(
        vmplane.run(&["get", "vm", "b", "-n", ns]).0 == 0,
        "b is still there"
    );
}

//! INTERFACE.md's "first five minutes", exactly as a newcomer types it, on a fresh server (the
//! README's run command, the project's own `examples/`, namespace `default`).
//!
//! The server runs its real reconciler on libvirt's test driver, so `get vmi demo` after
//! `start` shows the VMI Running on a node.

use vmplane_tests::{Cli, Server, repo_root};

/// Cells of an aligned table: every row's cell starts at its header's column, or is empty.
pub fn table_cells(table: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = table.lines();
    let header_line = lines.next().expect("a header line");
    let mut starts = Vec::new();
    let mut header = Vec::new();
    let bytes = header_line.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b != b' ' && (i == 0 || bytes[i - 1] == b' ') {
            starts.push(i);
        }
    }
    for (n, start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(header_line.len());
        header.push(header_line[*start..end].trim().to_string());
    }
    let mut rows = Vec::new();
    for line in lines {
        let mut row = Vec::new();
        for (n, start) in starts.iter().enumerate() {
            assert!(
                line.len() > *start,
                "row too short for column {}: {line:?}\n{table}",
                header[n]
            );
            let end = match starts.get(n + 1) {
                Some(next) => (*next).min(line.len()),
                None => line.len(),
            };
            let cell = &line[*start..end];
            assert!(
                *start == 0 || line.as_bytes()[start - 1] == b' ',
                "column {} is not aligned in row {line:?}\n{table}",
                header[n]
            );
            // A cell is empty (all spaces, as a VMI's NODE before it is placed) or starts
            // exactly under its header.
            assert!(
                cell.trim().is_empty() || !cell.starts_with(' '),
                "column {} is not aligned in row {line:?}\n{table}",
                header[n]
            );
            row.push(cell.trim().to_string());
        }
        rows.push(row);
    }
    (header, rows)
}

fn yaml(text: &str) -> serde_json::Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}"))
}

#[test]
fn the_first_five_minutes_work_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("vmplane-data"), &[]);
    let vmplane = Cli::new(&server);
    let examples = repo_root().join("examples");
    let vm_yaml = examples.join("vm.yaml");
    let bigger_yaml = examples.join("vm-bigger.yaml");

    // vmplane apply -f examples/vm.yaml
    let out = vmplane.ok(&["apply", "-f", vm_yaml.to_str().expect("utf-8")]);
    assert_eq!(out, "virtualmachine/demo created\n");

    // vmplane get vms: NAME  STATUS  AGE  GENERATION  FIRMWARE-UUID, aligned.
    let out = vmplane.ok(&["get", "vms"]);
    let (header, rows) = table_cells(&out);
    assert_eq!(
        header,
        ["NAME", "STATUS", "AGE", "GENERATION", "FIRMWARE-UUID"]
    );
    assert_eq!(rows.len(), 1, "{out}");
    let row = &rows[0];
    assert_eq!(row[0], "demo");
    assert_eq!(row[1], "Stopped", "runStrategy Manual, not started: {out}");
    assert!(
        row[2].ends_with('s') && row[2][..row[2].len() - 1].parse::<u64>().is_ok(),
        "AGE like kubectl's: {out}"
    );
    assert_eq!(row[3], "1");
    let firmware = uuid::Uuid::parse_str(&row[4]).expect("FIRMWARE-UUID is a UUID");
    let stored = yaml(&vmplane.ok(&["get", "vm", "demo", "-o", "yaml"]));
    assert_eq!(
        stored["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"],
        firmware.to_string()
    );
    assert_eq!(stored["status"]["firmwareUUIDOrigin"], "Generated");

    // vmplane start demo (the VMI stays Pending without a hypervisor: not checked here).
    assert_eq!(
        vmplane.ok(&["start", "demo"]),
        "virtualmachine/demo start requested\n"
    );
    // vmplane get vmi demo: Running, on a node (the reconciler acts asynchronously).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (code, out, _) = vmplane.run(&["get", "vmi", "demo"]);
        if code == 0 {
            let (header, rows) = table_cells(&out);
            assert_eq!(header, ["NAME", "PHASE", "AGE", "NODE", "FIRMWARE-UUID"]);
            if rows[0][1] == "Running" {
                assert_eq!(rows[0][3], "node1", "on a node");
                assert_eq!(
                    rows[0][4],
                    firmware.to_string(),
                    "the VMI runs with the VM's firmware UUID"
                );
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the VMI did not reach Running: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // vmplane apply -f examples/vm-bigger.yaml: an edit, generation 2, same firmware.
    let out = vmplane.ok(&["apply", "-f", bigger_yaml.to_str().expect("utf-8")]);
    assert_eq!(out, "virtualmachine/demo configured\n");
    let (_, rows) = table_cells(&vmplane.ok(&["get", "vms"]));
    assert_eq!(rows[0][0], "demo");
    assert_eq!(
        rows[0][4],
        firmware.to_string(),
        "an edit keeps the firmware"
    );
    assert_eq!(rows[0][3], "2", "an edit: generation 2");
    let current = yaml(&vmplane.ok(&["get", "vm", "demo", "-o", "yaml"]));
    assert_eq!(current["metadata"]["generation"], 2);
    assert_eq!(
        current["spec"]["template"]["spec"]["domain"]["cpu"]["cores"],
        2
    );

    // vmplane history vm demo: one row per revision, by principal `local`.
    let out = vmplane.ok(&["history", "vm", "demo"]);
    let (header, rows) = table_cells(&out);
    assert_eq!(
        header,
        ["REVISION", "POSITION", "TIME", "ACTOR", "EVENTS", "SUMMARY"]
    );
    // The user's revisions: created, start requested, spec edited (the start request is a
    // revision of the stream but not a new generation of the spec, as in KubeVirt). The
    // reconciler's observations of the VMI are revisions too, by `system:` principals.
    let by_user: Vec<&str> = rows
        .iter()
        .filter(|r| r[3] == "local")
        .map(|r| r[4].as_str())
        .collect();
    assert_eq!(
        by_user,
        ["VmCreated", "VmStartRequested", "VmSpecEdited"],
        "{out}"
    );
    for (i, r) in rows.iter().enumerate() {
        assert!(r[3] == "local" || r[3].starts_with("system:"), "{out}");
        assert_eq!(r[0], (i + 1).to_string(), "revisions are gapless: {out}");
        chrono::DateTime::parse_from_rfc3339(&r[2]).expect("TIME is RFC 3339");
    }
    let last_revision = rows.len().to_string();

    // vmplane diff vm demo --from 1: a unified diff, exit 1.
    let (code, out, err) = vmplane.run(&["diff", "vm", "demo", "--from", "1"]);
    assert_eq!(code, 1, "different revisions exit 1: {err}");
    assert!(
        out.starts_with("--- revision 1\n+++ revision "),
        "unified diff headers: {out}"
    );
    assert!(out.contains("\n@@ "), "a hunk: {out}");
    for line in [
        "-        cores: 1",
        "+        cores: 2",
        "-        guest: 256Mi",
        "+        guest: 512Mi",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} missing:\n{out}");
    }
    assert!(!out.contains('\x1b'), "no color when not a terminal");
    // Equal revisions: exit 0, nothing printed.
    let (code, out, _) = vmplane.run(&["diff", "vm", "demo", "--from", &last_revision]);
    assert_eq!((code, out.as_str()), (0, ""));
    let (code, out, _) = vmplane.run(&["diff", "vm", "demo", "--from", "1", "--to", "1"]);
    assert_eq!((code, out.as_str()), (0, ""));
    // An error: exit > 1 with one clear line.
    let (code, _, err) = vmplane.run(&["diff", "vm", "demo", "--from", "99"]);
    assert!(code > 1, "an error exits > 1, got {code}");
    let line = vmplane_tests::one_error_line(&err);
    assert!(line.contains("99"), "names the revision: {line}");
    let (code, _, _) = vmplane.run(&["diff", "vm", "nosuchvm", "--from", "1"]);
    assert!(code > 1);

    // vmplane get vm demo --revision 1 -o yaml: time travel to the old spec.
    let old = yaml(&vmplane.ok(&["get", "vm", "demo", "--revision", "1", "-o", "yaml"]));
    assert_eq!(old["metadata"]["generation"], 1);
    assert_eq!(old["spec"]["template"]["spec"]["domain"]["cpu"]["cores"], 1);
    assert_eq!(
        old["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
        "256Mi"
    );
    assert_eq!(
        old["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"],
        firmware.to_string()
    );

    // vmplane snapshot demo snap1 && vmplane clone demo demo2
    let out = vmplane.ok(&["snapshot", "demo", "snap1"]);
    assert!(out.contains("snap1") && out.contains("Succeeded"), "{out}");
    vmplane.ok(&["clone", "demo", "demo2"]);
    let clone: serde_json::Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "demo2", "-o", "json"]))
            .expect("clone JSON");
    let clone_uuid = clone["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"]
        .as_str()
        .unwrap_or("");
    assert!(
        !clone_uuid.is_empty() && clone_uuid != firmware.to_string(),
        "a clone gets a new firmware UUID"
    );
    assert_eq!(clone["status"]["firmwareUUIDOrigin"], "Cloned");

    // vmplane audit: who did all that, in order.
    let out = vmplane.ok(&["audit"]);
    let (header, rows) = table_cells(&out);
    assert_eq!(
        header,
        [
            "POSITION",
            "TIME",
            "ACTOR",
            "NAMESPACE",
            "KIND",
            "NAME",
            "EVENT",
            "SUMMARY"
        ]
    );
    let by_user: Vec<&str> = rows
        .iter()
        .filter(|r| r[2] == "local")
        .map(|r| r[6].as_str())
        .collect();
    assert_eq!(
        by_user,
        [
            "VmCreated",
            "VmStartRequested",
            "VmSpecEdited",
            "ObjectCreated",
            "SnapshotTaken",
            "ObjectCreated",
            "CloneStarted",
            "VmCreated",
            "CloneSucceeded"
        ],
        "{out}"
    );
    for r in &rows {
        assert_eq!(r[3], "default", "{out}");
        if r[2] == "local" {
            assert!(
                [
                    "VirtualMachine",
                    "VirtualMachineSnapshot",
                    "VirtualMachineClone"
                ]
                .contains(&r[4].as_str()),
                "{out}"
            );
        } else {
            assert!(r[2].starts_with("system:"), "{out}");
            assert_eq!(r[5], "demo", "only demo was started: {out}");
        }
    }
    let positions: Vec<u64> = rows
        .iter()
        .map(|r| r[0].parse().expect("position"))
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "audit is in log order: {out}"
    );
}

#[test]
fn the_table_reader_takes_empty_cells_and_refuses_a_shifted_one() {
    let (header, rows) = table_cells(
        "NAME   PHASE     NODE    UUID\n\
         demo   Pending           4fa1\n\
         other  Running   node1   5e2b",
    );
    assert_eq!(header, ["NAME", "PHASE", "NODE", "UUID"]);
    assert_eq!(rows[0], ["demo", "Pending", "", "4fa1"]);
    assert_eq!(rows[1], ["other", "Running", "node1", "5e2b"]);
    let shifted = std::panic::catch_unwind(|| {
        table_cells(
            "NAME   PHASE     NODE    UUID\n\
             demo   Pending    node1  4fa1",
        )
    });
    assert!(
        shifted.is_err(),
        "a cell one column right of its header is refused"
    );
}

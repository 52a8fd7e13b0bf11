//! `audit --kind` and `watch --kind` of a cluster-scoped kind (the cluster config, cluster
//! instancetypes and preferences): their entries are in no namespace, so they are found without
//! `-A`, and every principal sees them, as it reads the objects; a namespaced kind stays in
//! `-n`'s namespace and its roles.

use std::io::{BufRead, BufReader};

use serde_json::Value;
use vmplane_tests::{AuthToken, Cli, Server, write_auth_file};

const OPS: &str = "cli-audit-ops-token";
const VERA: &str = "cli-audit-vera-token";

fn entries(out: &str) -> Vec<Value> {
    serde_json::from_str::<Value>(out)
        .expect("audit JSON")
        .as_array()
        .expect("a list")
        .clone()
}

#[test]
fn audit_and_watch_of_a_cluster_scoped_kind_show_its_entries_without_all_namespaces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth_file = dir.path().join("auth.yaml");
    write_auth_file(
        &auth_file,
        &[
            AuthToken {
                principal: "ops",
                token: OPS,
                roles: &[("admin", &[])],
            },
            AuthToken {
                principal: "vera",
                token: VERA,
                roles: &[("view", &["team-a"])],
            },
        ],
    );
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--auth",
            auth_file.to_str().expect("utf-8"),
            "--hypervisor",
            "none",
        ],
    );
    let ops = Cli::new(&server).with_token(OPS);
    let vera = Cli::new(&server).with_token(VERA);
    let kubevirt = "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  \
                    namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      \
                    featureGates: [Snapshot]\n";
    let cluster_it = "apiVersion: instancetype.kubevirt.io/v1beta1\nkind: \
                      VirtualMachineClusterInstancetype\nmetadata: {name: audited}\nspec:\n  \
                      cpu: {guest: 1}\n  memory: {guest: 128Mi}\n";
    for manifest in [kubevirt, cluster_it] {
        let (code, _, err) = ops.run_with_stdin(&["apply", "-f", "-"], manifest);
        assert_eq!(code, 0, "{err}");
    }

    for kind in ["kubevirt", "KubeVirt"] {
        let found = entries(&ops.ok(&["audit", "--kind", kind, "-o", "json"]));
        assert_eq!(found.len(), 1, "{kind}: {found:?}");
        assert_eq!(
            (found[0]["kind"].as_str(), found[0]["name"].as_str()),
            (Some("KubeVirt"), Some("kubevirt"))
        );
        assert_eq!(found[0]["namespace"], "");
    }
    let (code, out, err) = ops.run(&["audit", "--kind", "kubevirt"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "a header and the entry: {out}");
    assert!(out.contains("KubeVirt"), "{out}");
    assert!(!err.contains("No audit entries"), "{err}");
    // From any -n: the kind is in none.
    let found = entries(&ops.ok(&[
        "audit",
        "--kind",
        "clusterinstancetype",
        "-n",
        "team-a",
        "-o",
        "json",
    ]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["name"], "audited");

    // A viewer of team-a reads the cluster-wide objects, and so their entries, from its
    // namespace or from one where it has no role.
    for ns in ["team-a", "default"] {
        let found = entries(&vera.ok(&["audit", "--kind", "kubevirt", "-n", ns, "-o", "json"]));
        assert_eq!(found.len(), 1, "-n {ns}: {found:?}");
    }
    // So does a watch of the kind, from either namespace, without -A.
    for ns in ["team-a", "default"] {
        let mut watch = vera.spawn(&[
            "watch",
            "clusterinstancetype",
            "-n",
            ns,
            "--from-position",
            "0",
            "-o",
            "json",
        ]);
        let first = BufReader::new(watch.stdout.take().expect("stdout"))
            .lines()
            .next()
            .expect("an event")
            .expect("read the watch");
        let _ = watch.kill();
        let _ = watch.wait();
        let event: Value = serde_json::from_str(&first).expect("a JSON event");
        assert_eq!(
            (event["kind"].as_str(), event["name"].as_str()),
            (Some("VirtualMachineClusterInstancetype"), Some("audited")),
            "-n {ns}: {first}"
        );
    }
    let line = vera.fails(&["watch", "vm", "-n", "default"]);
    assert!(line.contains("permission denied"), "{line}");

    // A namespaced kind keeps to -n's namespace and the reader's roles there.
    let line = vera.fails(&["audit", "--kind", "vm", "-n", "default"]);
    assert!(line.contains("permission denied"), "{line}");
    assert_eq!(
        entries(&vera.ok(&["audit", "--kind", "vm", "-n", "team-a", "-o", "json"])).len(),
        0
    );

    // None yet: said for the kind, not for a namespace it is not in.
    let (code, out, err) = ops.run(&["audit", "--kind", "clusterpreference"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert_eq!(
        err,
        "No audit entries found for VirtualMachineClusterPreference (cluster-scoped: in no \
         namespace).\n"
    );
}

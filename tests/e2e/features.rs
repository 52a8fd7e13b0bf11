//! Cluster feature configuration through the CLI (issue 8): gates set by a `KubeVirt` manifest
//! (admin only), `features` and `features usage`, and the rules for VMs — a disabled feature
//! blocks a start (no VMI, `Failure`/`FeatureNotEnabled` naming feature and field), disabling
//! never rejects the change nor kills a running VM (it gets a condition and the metric) and a
//! re-enable lets it run again. The server runs its real reconciler on libvirt's test driver.

use std::time::{Duration, Instant};

use serde_json::Value;
use vmplane_tests::{AuthToken, Cli, Server, write_auth_file};

/// The cluster configuration with DownwardMetrics on or off.
fn kubevirt_config(downward_metrics: bool) -> String {
    let list = if downward_metrics {
        "featureGates"
    } else {
        "disabledFeatureGates"
    };
    format!(
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      {list}: [DownwardMetrics]\n"
    )
}

/// A VM that requests DownwardMetrics through `domain.devices.downwardMetrics`.
fn metrics_vm(name: &str, run_strategy: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: {name}\nspec:\n  runStrategy: {run_strategy}\n  template:\n    spec:\n      domain:\n        memory: {{guest: 128Mi}}\n        devices:\n          downwardMetrics: {{}}\n"
    )
}

fn apply(cli: &Cli, yaml: &str) -> String {
    let (code, out, err) = cli.run_with_stdin(&["apply", "-f", "-"], yaml);
    assert_eq!(code, 0, "apply failed\nstdout: {out}\nstderr: {err}");
    out
}

fn vm_json(cli: &Cli, name: &str) -> Value {
    serde_json::from_str(&cli.ok(&["get", "vm", name, "-o", "json"])).expect("VM JSON")
}

fn condition<'a>(vm: &'a Value, kind: &str) -> Option<&'a Value> {
    vm["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn printable(vm: &Value) -> String {
    vm["status"]["printableStatus"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Polls `probe` until it holds (the reconciler acts asynchronously).
#[track_caller]
fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !probe() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn features_json(cli: &Cli) -> Vec<Value> {
    serde_json::from_str::<Value>(&cli.ok(&["features", "-o", "json"]))
        .expect("features JSON")
        .as_array()
        .cloned()
        .expect("a list")
}

fn feature<'a>(list: &'a [Value], name: &str) -> &'a Value {
    list.iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

#[test]
fn features_show_every_gate_with_its_stage_and_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);

    let list = features_json(&cli);
    assert!(
        list.len() > 50,
        "KubeVirt registers dozens of gates, got {}",
        list.len()
    );
    let dm = feature(&list, "DownwardMetrics");
    assert_eq!(
        (
            dm["enabled"].as_bool(),
            dm["source"].as_str(),
            dm["stage"].as_str()
        ),
        (Some(false), Some("default"), Some("Alpha"))
    );
    let snap = feature(&list, "Snapshot");
    assert_eq!(
        (snap["enabled"].as_bool(), snap["stage"].as_str()),
        (Some(true), Some("Beta"))
    );
    let gpu = feature(&list, "GPU");
    assert_eq!(
        (gpu["enabled"].as_bool(), gpu["stage"].as_str()),
        (Some(true), Some("GA"))
    );

    apply(&cli, &kubevirt_config(true));
    let dm = feature(&features_json(&cli), "DownwardMetrics").clone();
    assert_eq!(
        (dm["enabled"].as_bool(), dm["source"].as_str()),
        (Some(true), Some("explicit"))
    );

    // The table lines up and has the documented columns.
    let table = cli.ok(&["features"]);
    assert!(table.starts_with("NAME"), "{table}");
    for col in ["ENABLED", "SOURCE", "STAGE", "USED-BY"] {
        assert!(table.lines().next().unwrap_or("").contains(col), "{table}");
    }
}

#[test]
fn a_bad_cluster_config_is_refused_naming_the_field_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let cases = [
        (
            "featureGates: [DownwardMetrics]\n      disabledFeatureGates: [DownwardMetrics]",
            "disabledFeatureGates[0]",
        ),
        (
            "featureGates: [NoSuchGate]\n      disabledFeatureGates: [NoSuchGate]",
            "featureGates[0]",
        ),
    ];
    for (gates, field) in cases {
        let yaml = format!(
            "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      {gates}\n"
        );
        let (code, _out, err) = cli.run_with_stdin(&["apply", "-f", "-"], &yaml);
        assert_ne!(code, 0, "{gates} must be refused");
        assert!(
            err.contains(field),
            "{gates}: error does not name {field}: {err}"
        );
    }
    // Nothing was stored: defaults still apply.
    let dm = feature(&features_json(&cli), "DownwardMetrics").clone();
    assert_eq!(dm["source"], "default");
}

/// D7: a `KubeVirt` CR exported from a real cluster may list gates this version does not
/// register, or Discontinued ones: KubeVirt accepts it (with warnings), and so does vmplane,
/// storing it unchanged and enabling neither.
#[test]
fn a_cluster_config_listing_unknown_and_discontinued_gates_applies_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let yaml = "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      featureGates: [DownwardMetrics, NoSuchGate, Macvtap]\n      disabledFeatureGates: [Passt, NoLongerAGate]\n";
    // Accepted, and told why each ignored name has no effect, as kubectl prints admission
    // warnings: on stderr, exit status 0.
    let (code, out, err) = cli.run_with_stdin(&["apply", "-f", "-"], yaml);
    assert_eq!(code, 0, "apply failed\nstdout: {out}\nstderr: {err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("Warning: ")).collect();
    for (entry, words) in [
        ("featureGates[1]", "unknown feature gate \"NoSuchGate\""),
        ("featureGates[2]", "Macvtap is discontinued"),
        (
            "disabledFeatureGates[1]",
            "unknown feature gate \"NoLongerAGate\"",
        ),
    ] {
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("Warning: kubevirt/kubevirt: ")
                    && w.contains(entry)
                    && w.contains(words)),
            "no warning for {entry}: {err}"
        );
    }
    let stored: Value =
        serde_json::from_str(&cli.ok(&["get", "kubevirt", "kubevirt", "-o", "json"]))
            .expect("KubeVirt JSON");
    let dev = &stored["spec"]["configuration"]["developerConfiguration"];
    assert_eq!(
        dev["featureGates"],
        serde_json::json!(["DownwardMetrics", "NoSuchGate", "Macvtap"])
    );
    assert_eq!(
        dev["disabledFeatureGates"],
        serde_json::json!(["Passt", "NoLongerAGate"])
    );
    // Re-applying the same CR changes nothing.
    let again = apply(&cli, yaml);
    assert!(again.contains("unchanged"), "{again}");

    let list = features_json(&cli);
    let dm = feature(&list, "DownwardMetrics");
    assert_eq!(
        (dm["enabled"].as_bool(), dm["source"].as_str()),
        (Some(true), Some("explicit"))
    );
    // A Discontinued gate shows as what it is: off, its stage's default, whatever the lists say.
    for name in ["Macvtap", "Passt"] {
        let f = feature(&list, name);
        assert_eq!(
            (
                f["enabled"].as_bool(),
                f["source"].as_str(),
                f["stage"].as_str()
            ),
            (Some(false), Some("default"), Some("Discontinued")),
            "{name}"
        );
    }
    // Unknown names are no features: not listed, not enabled.
    for name in ["NoSuchGate", "NoLongerAGate"] {
        assert!(list.iter().all(|f| f["name"] != name), "{name} listed");
    }
}

#[test]
fn only_an_admin_changes_the_cluster_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = dir.path().join("auth.yaml");
    write_auth_file(
        &auth,
        &[
            AuthToken {
                principal: "ops",
                token: "ops-token",
                roles: &[("admin", &[])],
            },
            AuthToken {
                principal: "alice",
                token: "alice-token",
                roles: &[("edit", &["default"])],
            },
        ],
    );
    let auth = auth.to_str().expect("utf-8");
    let server = Server::start(
        &dir.path().join("data"),
        &["--hypervisor", "none", "--auth", auth],
    );
    let alice = Cli::new(&server).with_token("alice-token");
    let (code, _, err) = alice.run_with_stdin(&["apply", "-f", "-"], &kubevirt_config(true));
    assert_ne!(code, 0);
    assert!(err.contains("permission denied"), "{err}");
    // Reading the effective features is allowed to every principal.
    assert_eq!(
        feature(&features_json(&alice), "DownwardMetrics")["enabled"],
        false
    );
    let ops = Cli::new(&server).with_token("ops-token");
    apply(&ops, &kubevirt_config(true));
    assert_eq!(
        feature(&features_json(&alice), "DownwardMetrics")["enabled"],
        true
    );
}

#[test]
fn a_disabled_feature_blocks_a_start_and_disabling_never_kills_a_running_vm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let cli = Cli::new(&server);

    // Gate off (the default for an Alpha feature): a start creates no VMI.
    apply(&cli, &metrics_vm("dm", "Manual"));
    let stopped = vm_json(&cli, "dm");
    let mismatch = condition(&stopped, "FeatureMismatch").expect("a stopped VM shows the mismatch");
    assert!(
        mismatch["message"]
            .as_str()
            .unwrap_or("")
            .contains("DownwardMetrics"),
        "{mismatch}"
    );
    cli.ok(&["start", "dm"]);
    eventually("the VM shows Failure/FeatureNotEnabled", || {
        let vm = vm_json(&cli, "dm");
        condition(&vm, "Failure").is_some_and(|c| c["reason"] == "FeatureNotEnabled")
    });
    let vm = vm_json(&cli, "dm");
    let failure = condition(&vm, "Failure").expect("Failure condition");
    let message = failure["message"].as_str().unwrap_or("");
    assert!(
        message.contains("DownwardMetrics") && message.contains("downwardMetrics"),
        "names feature and field: {message}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let (code, _, _) = cli.run(&["get", "vmi", "dm"]);
    assert_ne!(
        code, 0,
        "no VMI may be created while the feature is disabled"
    );
    assert!(!cli.ok(&["history", "vm", "dm"]).contains("VmiLaunched"));

    // Enable: the pending start goes through and the VM runs.
    apply(&cli, &kubevirt_config(true));
    eventually("the VM runs once the feature is enabled", || {
        printable(&vm_json(&cli, "dm")) == "Running"
    });
    assert!(
        condition(&vm_json(&cli, "dm"), "Failure").is_none(),
        "the Failure condition clears"
    );

    // Disable while running: accepted, the VM keeps running and gets a condition.
    apply(&cli, &kubevirt_config(false));
    std::thread::sleep(Duration::from_millis(500));
    let vm = vm_json(&cli, "dm");
    assert_eq!(
        printable(&vm),
        "Running",
        "disabling a feature never kills a running VM"
    );
    let c =
        condition(&vm, "FeatureMismatch").expect("a running VM with a disabled feature says so");
    assert_eq!(c["reason"], "FeatureDisabledWhileRunning");

    // Once stopped it cannot start again until re-enabled.
    cli.ok(&["stop", "dm"]);
    eventually("the VM stops", || {
        printable(&vm_json(&cli, "dm")) == "Stopped"
    });
    cli.ok(&["start", "dm"]);
    eventually("the start is blocked", || {
        condition(&vm_json(&cli, "dm"), "Failure")
            .is_some_and(|c| c["reason"] == "FeatureNotEnabled")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(printable(&vm_json(&cli, "dm")), "Stopped");

    // Re-enable: it runs again.
    apply(&cli, &kubevirt_config(true));
    eventually("the VM runs again after re-enabling", || {
        printable(&vm_json(&cli, "dm")) == "Running"
    });
}

#[test]
fn feature_usage_lists_the_vms_that_request_it_among_thousands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    const VMS: usize = 2_000;
    let mut docs = String::new();
    for i in 0..VMS {
        if i % 4 == 0 {
            docs.push_str(&metrics_vm(&format!("dm-{i}"), "Halted"));
        } else {
            docs.push_str(&format!(
                "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: plain-{i}\nspec:\n  runStrategy: Halted\n  template:\n    spec:\n      domain:\n        memory: {{guest: 64Mi}}\n        devices: {{}}\n"
            ));
        }
        docs.push_str("---\n");
    }
    let created = apply(&cli, &docs);
    assert_eq!(created.lines().count(), VMS);

    let started = Instant::now();
    let out = cli.ok(&["features", "usage", "DownwardMetrics", "-o", "json"]);
    let elapsed = started.elapsed();
    let v: Value = serde_json::from_str(&out).expect("usage JSON");
    let users = v["usedBy"].as_array().expect("usedBy list");
    assert_eq!(users.len(), VMS / 4);
    assert!(
        users
            .iter()
            .all(|u| u["name"].as_str().unwrap_or("").starts_with("dm-"))
    );
    assert_eq!(
        feature(&features_json(&cli), "DownwardMetrics")["usedBy"],
        VMS as u64 / 4
    );
    // Figures, not assertions: the whole CLI round trip, process start included. The first
    // query after the writes also settles the index lazily; the second is the steady state.
    let again = Instant::now();
    cli.ok(&["features", "usage", "DownwardMetrics", "-o", "json"]);
    let warm = again.elapsed();
    eprintln!(
        "features usage over {VMS} VMs: first {elapsed:?}, again {warm:?} (CLI process start and gRPC round trip included)"
    );
}

#[test]
fn a_standalone_vmi_with_a_disabled_feature_stays_pending_and_is_listed_as_a_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let cli = Cli::new(&server);
    let vmi = "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: lone\nspec:\n  domain:\n    memory: {guest: 64Mi}\n    devices:\n      downwardMetrics: {}\n";
    apply(&cli, vmi);
    std::thread::sleep(Duration::from_millis(800));
    let got: Value =
        serde_json::from_str(&cli.ok(&["get", "vmi", "lone", "-o", "json"])).expect("VMI JSON");
    assert_ne!(
        got["status"]["phase"], "Running",
        "a blocked VMI must not run: {got}"
    );
    assert!(
        got["status"]["nodeName"].is_null(),
        "a blocked VMI is not scheduled: {got}"
    );
    let sync = condition(&got, "Synchronized").expect("Synchronized condition");
    assert_eq!(
        (sync["status"].as_str(), sync["reason"].as_str()),
        (Some("False"), Some("FeatureNotEnabled"))
    );
    let usage: Value =
        serde_json::from_str(&cli.ok(&["features", "usage", "DownwardMetrics", "-o", "json"]))
            .expect("usage JSON");
    assert!(
        usage["usedBy"].as_array().is_some_and(|u| u
            .iter()
            .any(|x| x["kind"] == "VirtualMachineInstance" && x["name"] == "lone")),
        "{usage}"
    );
    // Enabling the feature lets it run.
    apply(&cli, &kubevirt_config(true));
    eventually("the VMI runs once the feature is enabled", || {
        let v: Value =
            serde_json::from_str(&cli.ok(&["get", "vmi", "lone", "-o", "json"])).expect("VMI JSON");
        v["status"]["phase"] == "Running"
    });
}

//! libvirt's and libxml2's own printing is off: a failure reaches the caller as an error and
//! nothing else reaches standard error. Checked in a child process (this test binary again),
//! whose standard error the test reads.

use std::process::Command;

use vmplane_hypervisor::{LibvirtHypervisor, Nodes, NodesError};

/// Set in the child: it opens the node instead of spawning.
const CHILD_ENV: &str = "VMPLANE_QUIET_CHILD";
const TEST_NAME: &str = "quiet::a_missing_test_driver_file_is_one_error_and_no_libxml2_noise";

/// Audit: a missing test-driver file printed libxml2's
/// `I/O warning : failed to load external entity "…"` before vmplane's own one-line error.
#[test]
fn a_missing_test_driver_file_is_one_error_and_no_libxml2_noise() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let dir = tempfile::tempdir().expect("temp dir");
        let uri = format!("test://{}/missing.xml", dir.path().display());
        let err = LibvirtHypervisor::open(&uri).expect_err("there is no node file");
        println!("vmplane said: {err}");
        return;
    }
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("vmplane said: cannot connect to test://")
            && stdout.contains("missing.xml"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("warning") && !stderr.contains("missing.xml"),
        "libvirt or libxml2 printed on their own:\n{stderr}"
    );
}

/// Audit: `--hypervisor` with a name given twice was reported as a libvirt failure of the
/// first one (it was opened first). The arguments are checked before anything is opened.
#[test]
fn a_node_given_twice_is_said_before_anything_is_opened() {
    let missing = "a=test:///nonexistent/dir/node.xml";
    let err = Nodes::open(&[missing, missing]).expect_err("a name given twice");
    assert!(
        matches!(&err, NodesError::Duplicate { name } if name == "a"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "node \"a\" is given twice");
    assert_eq!(err.hint(), "give each node a name of its own");
}

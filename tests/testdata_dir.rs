//! Where the shared KubeVirt manifests are: one rule for every test crate that loads them (the
//! domain tests, the projections tests and the end-to-end tests include this file with `#[path]`,
//! so they cannot disagree).
//!
//! The manifests live outside the repository, in `shared/testdata/kubevirt` (see its
//! `SOURCES.txt`), and are loaded as they are. Looked for, in order:
//! 1. `$VMPLANE_TESTDATA/kubevirt` when `VMPLANE_TESTDATA` is set (the `shared/testdata`
//!    directory);
//! 2. `shared/testdata/kubevirt` beside the repository (`<repo>/../shared`);
//! 3. `/work/shared/testdata/kubevirt`, where this machine kind keeps it, so a checkout placed
//!    elsewhere (a CI clone in a temporary directory) still finds it.

use std::path::{Path, PathBuf};

/// The `shared/testdata/kubevirt` directory (see the module's doc for where it is looked for).
pub fn kubevirt_testdata() -> PathBuf {
    let base = match std::env::var_os("VMPLANE_TESTDATA") {
        Some(dir) => PathBuf::from(dir),
        None => {
            // Every crate including this file sits one level below the repository's root.
            let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata");
            if beside.exists() {
                beside
            } else {
                PathBuf::from("/work/shared/testdata")
            }
        }
    };
    base.join("kubevirt")
}

//! One 3-member etcd cluster shared by every test of a test binary (each test uses its own
//! namespace), started on first use. If etcd is not installed, every test fails saying how to
//! install it; nothing passes silently.

#![allow(dead_code)]

use std::sync::OnceLock;

use vmplane_store_etcd::harness::EtcdCluster;

static CLUSTER: OnceLock<Result<EtcdCluster, String>> = OnceLock::new();

/// The shared cluster (never dropped: its watchdog cleans up after the test process).
pub fn cluster() -> &'static EtcdCluster {
    match CLUSTER.get_or_init(|| EtcdCluster::start(3).map_err(|err| err.to_string())) {
        Ok(cluster) => cluster,
        Err(err) => panic!("no etcd cluster for the tests: {err}"),
    }
}

/// A namespace no other test uses.
pub fn namespace(test: &str) -> String {
    format!("test/{test}/{}", uuid::Uuid::now_v7().simple())
}

//! The storage contract, run unchanged against the etcd backend on a real 3-member cluster.
//! Each test gets a fresh namespace on one shared cluster; `reopen` opens a new `EtcdLog` on the
//! same namespace, as a restarted server would.

mod support;

use std::sync::Arc;

use vmplane_store::EventLog;
use vmplane_store::contract::Fixture;
use vmplane_store_etcd::{EtcdLog, EtcdOptions};

struct EtcdFixture {
    options: EtcdOptions,
    log: Option<Arc<EtcdLog>>,
}

impl Fixture for EtcdFixture {
    fn log(&self) -> Arc<dyn EventLog> {
        self.log.clone().expect("the log is open")
    }

    fn reopen(&mut self) -> Arc<dyn EventLog> {
        let old = self.log.take().expect("the log is open");
        assert_eq!(
            Arc::strong_count(&old),
            1,
            "callers dropped their handles before reopening"
        );
        drop(old);
        let log = Arc::new(EtcdLog::open(self.options.clone()).expect("reopen"));
        self.log = Some(Arc::clone(&log));
        log
    }
}

fn fixture() -> Box<dyn Fixture> {
    let options = support::cluster().options(&support::namespace("contract"));
    let log = Arc::new(EtcdLog::open(options.clone()).expect("open"));
    Box::new(EtcdFixture {
        options,
        log: Some(log),
    })
}

vmplane_store::contract_tests!(fixture);

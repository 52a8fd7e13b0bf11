//! The storage contract, run unchanged against the etcd backend on a real 3-member cluster.
//! Each test gets a fresh namespace on one shared cluster; `reopen` opens a new `EtcdLog` on the
//! same namespace, as a restarted server would.

mod support;

use std::sync::Arc;

use std::time::Duration;

use vmplane_store::contract::Fixture;
use vmplane_store::{EventLog, Fence};
use vmplane_store_etcd::{EtcdLog, EtcdOptions, Term};

struct EtcdFixture {
    options: EtcdOptions,
    log: Option<Arc<EtcdLog>>,
    term: Option<Term>,
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

    /// A real election: the previous term resigns (its lease is revoked, etcd deletes the key),
    /// then a campaign creates the key again under a new lease.
    fn take_fence(&mut self, name: &str) -> Fence {
        if let Some(term) = self.term.take() {
            term.resign();
        }
        let log = self.log.as_ref().expect("the log is open");
        let election = log
            .election(name, Duration::from_secs(5), "contract")
            .expect("election");
        let term = election
            .campaign(&|| false)
            .expect("campaign")
            .expect("elected");
        let fence = term.fence().clone();
        self.term = Some(term);
        fence
    }
}

fn fixture() -> Box<dyn Fixture> {
    let options = support::cluster().options(&support::namespace("contract"));
    let log = Arc::new(EtcdLog::open(options.clone()).expect("open"));
    Box::new(EtcdFixture {
        options,
        log: Some(log),
        term: None,
    })
}

vmplane_store::contract_tests!(fixture);

//! The storage contract, run against the file backend.

use std::sync::Arc;

use vmplane_store::contract::Fixture;
use vmplane_store::{EventLog, Fence, FileLog};

struct FileFixture {
    dir: tempfile::TempDir,
    log: Option<Arc<FileLog>>,
}

impl Fixture for FileFixture {
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
        let log = Arc::new(FileLog::open(self.dir.path()).expect("reopen"));
        self.log = Some(Arc::clone(&log));
        log
    }

    fn take_fence(&mut self, name: &str) -> Fence {
        self.log.as_ref().expect("the log is open").take_fence(name)
    }
}

fn fixture() -> Box<dyn Fixture> {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = Arc::new(FileLog::open(dir.path()).expect("open"));
    Box::new(FileFixture {
        dir,
        log: Some(log),
    })
}

vmplane_store::contract_tests!(fixture);

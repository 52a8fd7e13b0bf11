//! The file log's committer runs under `SCHED_BATCH` (`vmplane_store::threads`). A test binary
//! of its own: no other test's log committer is running in this process.

#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use vmplane_store::FileLog;
use vmplane_store::threads::{Policy, policies_of_threads_named};

#[test]
fn the_file_logs_committer_does_not_preempt_the_thread_that_wakes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(policies_of_threads_named("log committer").is_empty());
    let log = FileLog::open(dir.path()).expect("open the file log");
    // The committer sets its policy as it starts: wait for that.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = policies_of_threads_named("log committer");
        if found == [Policy::Batch.linux_number()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the committer's policy: {found:?}, want [{}] (SCHED_BATCH)",
            Policy::Batch.linux_number()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(log);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !policies_of_threads_named("log committer").is_empty() {
        assert!(Instant::now() < deadline, "the committer ends with the log");
        std::thread::sleep(Duration::from_millis(5));
    }
}

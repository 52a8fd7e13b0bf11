//! Reads of stream states that the command path found missing from the state cache, taken off
//! the runtime's worker by a few threads of their own.
//!
//! An apply to an object whose state is not in memory (a GitOps tool re-applying everything it
//! holds) needs the stream read back from the log and folded before it is decided. That read
//! blocks, so it cannot run on the runtime's worker. Handing each one to `spawn_blocking` cost
//! the worker a thread wake-up per apply, and the woken thread, at the same priority, often
//! took the worker's processor from it on the spot (the kernel's wake-up preemption), in the
//! middle of its pass over the connections.
//!
//! Here the reads wait in one queue taken by a few reader threads (one per processor, from 2 to
//! 8), woken only when one of them is idle, and running under `SCHED_BATCH`: the same share of
//! the processor as any thread, but a reader that is woken waits for the worker's time slice
//! to end instead of preempting it.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use tokio::sync::oneshot;
use tonic::Status;
use vmplane_core::types::Kind;
use vmplane_projections::command::CommandHandler;
use vmplane_store::threads::{Policy, run_this_thread_under};

/// Reader threads: one per processor, from 2 to 8. Each read is mostly a fold of events served
/// from the page cache, processor work: more readers than processors only add thread switches
/// (on this project's 2-processor machine, with the blocking tasks this queue first had, 4 gave
/// 0.86× the updates/s of 2), while 2 still overlap a read waiting on the disk with another.
fn readers_wanted() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// The queue of state reads and its reader threads (see the module's documentation). Dropping
/// it ends the readers once they have answered the reads queued.
pub struct StateLoads {
    shared: Arc<Shared>,
    readers: usize,
}

struct Shared {
    commands: Arc<CommandHandler>,
    queue: Mutex<Queue>,
    /// Rung when a read is queued while a reader is idle, and when the queue closes.
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Load>,
    /// Readers waiting for a read.
    idle: usize,
    closed: bool,
}

struct Load {
    stream: String,
    kind: Kind,
    /// Whether the state was read (and is now in the state cache).
    done: oneshot::Sender<bool>,
}

impl StateLoads {
    /// Reads through `commands` (into its state cache), on threads started here. Should no
    /// thread start, every read answers "not read" at once, and the caller takes its blocking
    /// path.
    pub fn new(commands: Arc<CommandHandler>) -> StateLoads {
        StateLoads::with_threads_named(commands, "state-reader")
    }

    /// As `new`, the reader threads under `name` (a test tells its own readers from those of
    /// any other `Api` in the process by it).
    fn with_threads_named(commands: Arc<CommandHandler>, name: &str) -> StateLoads {
        let shared = Arc::new(Shared {
            commands,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        let mut readers = 0;
        for _ in 0..readers_wanted() {
            let reader = Arc::clone(&shared);
            let started = std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || reader.serve());
            match started {
                Ok(_) => readers += 1,
                Err(e) => tracing::warn!(error = %e, "could not start a state reader thread"),
            }
        }
        StateLoads { shared, readers }
    }

    /// Reads the state of `stream` (of `kind`) into the state cache; `Ok(false)` when the read
    /// failed (the caller meets that failure again, and reports it, on its blocking path).
    pub async fn load(&self, stream: String, kind: Kind) -> Result<bool, Status> {
        if self.readers == 0 {
            return Ok(false);
        }
        let (done, answer) = oneshot::channel();
        {
            let mut queue = self.shared.lock();
            queue.waiting.push_back(Load { stream, kind, done });
            // Every reader busy: the first to finish takes this one, no wake-up needed.
            if queue.idle > 0 {
                self.shared.ready.notify_one();
            }
        }
        answer
            .await
            .map_err(|_| Status::internal("reading the object's state failed (reader stopped)"))
    }

    /// Readers waiting for a read now.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.shared.lock().idle
    }
}

impl Drop for StateLoads {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reader's loop: takes reads until the queue is closed and empty.
    fn serve(&self) {
        // Woken by the runtime's worker: it must not take the worker's processor.
        run_this_thread_under(Policy::Batch);
        loop {
            let load = {
                let mut queue = self.lock();
                loop {
                    if let Some(load) = queue.waiting.pop_front() {
                        break load;
                    }
                    if queue.closed {
                        return;
                    }
                    queue.idle += 1;
                    queue = self
                        .ready
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                    queue.idle -= 1;
                }
            };
            // A read that panics answers "not read" (the caller's blocking path meets it
            // again) and the reader goes on.
            let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.commands.load(&load.stream, load.kind).is_ok()
            }))
            .unwrap_or(false);
            // The caller may have gone (its request cancelled): nothing to tell.
            let _ = load.done.send(read);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use vmplane_core::types::parse_manifest;
    use vmplane_projections::command::{Command, CommandMeta};
    use vmplane_projections::{CommandOptions, Projections};
    use vmplane_store::threads::policies_of_threads_named;
    use vmplane_store::{EventLog, SledLog};

    use super::*;

    const VMS: usize = 300;

    /// This test's reader threads' name: no other test's readers answer to it.
    const READERS: &str = "loads-test";

    fn stream(i: usize) -> String {
        vmplane_projections::model::stream_of(Kind::VirtualMachine, "load", &format!("vm-{i}"))
    }

    #[test]
    fn many_reads_at_once_are_all_answered_by_the_readers_and_land_in_the_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path().join("log")).expect("log"));
        {
            let writer = Projections::open(log.clone(), &dir.path().join("a"), Default::default())
                .expect("projections");
            let commands = CommandHandler::new(
                log.clone(),
                writer.cache().clone(),
                CommandOptions::default(),
            );
            for i in 0..VMS {
                let manifest = format!(
                    r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"vm-{i}","namespace":"load"}},"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"memory":{{"guest":"64Mi"}},"devices":{{}}}}}}}}}}}}"#
                );
                let command = Command::apply(parse_manifest(manifest.as_bytes()).expect("parse"));
                let meta = CommandMeta {
                    actor: "test".into(),
                    ..Default::default()
                };
                commands.execute(&meta, command).expect("create");
            }
        }
        // A second server's view of the same log: none of the states is in its cache.
        let reader = Projections::open(log.clone(), &dir.path().join("b"), Default::default())
            .expect("projections");
        let cache = reader.cache().clone();
        for i in 0..VMS {
            assert!(cache.cached(&stream(i), Kind::VirtualMachine, 1).is_none());
        }
        let commands = Arc::new(CommandHandler::new(
            log,
            cache.clone(),
            CommandOptions::default(),
        ));
        let loads = Arc::new(StateLoads::with_threads_named(commands, READERS));
        assert_eq!(loads.readers, readers_wanted());
        // The readers wait, idle, under SCHED_BATCH (3 on Linux).
        let deadline = Instant::now() + Duration::from_secs(10);
        while loads.idle() < loads.readers {
            assert!(Instant::now() < deadline, "the readers start and wait");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            policies_of_threads_named(READERS),
            vec![Policy::Batch.linux_number(); loads.readers]
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let read = runtime.block_on(async {
            let reads: Vec<_> = (0..VMS)
                .map(|i| {
                    let loads = Arc::clone(&loads);
                    tokio::spawn(async move { loads.load(stream(i), Kind::VirtualMachine).await })
                })
                .collect();
            let mut read = Vec::new();
            for handle in reads {
                let answer = tokio::time::timeout(Duration::from_secs(30), handle)
                    .await
                    .expect("every read is answered (none left waiting in the queue)")
                    .expect("task");
                read.push(answer.expect("answer"));
            }
            read
        });
        assert!(read.iter().all(|r| *r), "every state was read");
        for i in 0..VMS {
            assert!(
                cache.cached(&stream(i), Kind::VirtualMachine, 1).is_some(),
                "vm-{i}'s state is in the cache"
            );
        }
        // Dropped, the readers end.
        drop(loads);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !policies_of_threads_named(READERS).is_empty() {
            assert!(Instant::now() < deadline, "the readers end once dropped");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

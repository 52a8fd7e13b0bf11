//! Reads of stream states that the command path found missing from the state cache, taken off
//! the runtime's worker in batches.
//!
//! An apply to an object whose state is not in memory (a GitOps tool re-applying everything it
//! holds) needs the stream read back from the log and folded before it is decided. That read
//! blocks, so it cannot run on the runtime's worker. Handing each one to `spawn_blocking` cost
//! a thread wake-up per apply, and as many parked threads as applies in flight, each woken once
//! and put to sleep again. Here the reads wait in one queue, and a few blocking tasks (drainers:
//! one per processor, at least 2) take them in turn. A drainer is started only when fewer are
//! running, and it ends when it finds the queue empty, so a busy server starts a drainer per
//! batch of reads, not per read.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tonic::Status;
use vmplane_core::types::Kind;
use vmplane_projections::command::CommandHandler;

/// Blocking tasks reading states at once: one per processor, from 2 to 8. Each read is mostly a
/// fold of events served from the page cache, processor work; more drainers than processors
/// only add thread switches (on this project's 2-processor machine, 4 drainers gave 0.86× the
/// updates/s of 2), while 2 still overlap a read waiting on the disk with another.
fn drainers_max() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// The queue of state reads and its drainers (see the module's documentation).
pub struct StateLoads {
    commands: Arc<CommandHandler>,
    drainers_max: usize,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Load>,
    /// Drainers started and not yet ended.
    drainers: usize,
}

struct Load {
    stream: String,
    kind: Kind,
    /// Whether the state was read (and is now in the state cache).
    done: oneshot::Sender<bool>,
}

impl StateLoads {
    /// Reads through `commands` (into its state cache).
    pub fn new(commands: Arc<CommandHandler>) -> Arc<StateLoads> {
        Arc::new(StateLoads {
            commands,
            drainers_max: drainers_max(),
            queue: Mutex::new(Queue::default()),
        })
    }

    /// Reads the state of `stream` (of `kind`) into the state cache; `Ok(false)` when the read
    /// failed (the caller meets that failure again, and reports it, on its blocking path).
    pub async fn load(self: &Arc<Self>, stream: String, kind: Kind) -> Result<bool, Status> {
        let (done, answer) = oneshot::channel();
        let start_drainer = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.waiting.push_back(Load { stream, kind, done });
            let start = queue.drainers < self.drainers_max;
            if start {
                queue.drainers += 1;
            }
            start
        };
        if start_drainer {
            let task = DrainerTask(Some(Arc::clone(self)));
            // Its handle is not awaited: the answer comes through `done`.
            drop(tokio::task::spawn_blocking(move || task.run()));
        }
        answer
            .await
            .map_err(|_| Status::internal("reading the object's state failed (worker stopped)"))
    }

    /// Takes reads from the queue until it is empty, then ends.
    fn drain(&self) {
        loop {
            let load = {
                let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                match queue.waiting.pop_front() {
                    Some(load) => load,
                    None => {
                        // Counted out under the lock that `load` counts in under: a read
                        // queued after this finds one drainer fewer and starts one.
                        queue.drainers -= 1;
                        return;
                    }
                }
            };
            // A read that panics answers "not read" (the caller's blocking path meets it
            // again) and the drainer goes on: one that ended here would leave the reads
            // queued behind it waiting for the next read to start a drainer.
            let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.commands.load(&load.stream, load.kind).is_ok()
            }))
            .unwrap_or(false);
            // The caller may have gone (its request cancelled): nothing to tell.
            let _ = load.done.send(read);
        }
    }

    /// Drainers running now.
    #[cfg(test)]
    fn drainers(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drainers
    }
}

/// A drainer handed to the blocking pool.
struct DrainerTask(Option<Arc<StateLoads>>);

impl DrainerTask {
    fn run(mut self) {
        if let Some(loads) = self.0.take() {
            loads.drain();
        }
    }
}

impl Drop for DrainerTask {
    /// Dropped without running: the runtime is shutting down. Counts the drainer out and
    /// drops the queued reads, whose callers are answered that the read failed.
    fn drop(&mut self) {
        if let Some(loads) = self.0.take() {
            let mut queue = loads.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.drainers -= 1;
            queue.waiting.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vmplane_core::types::parse_manifest;
    use vmplane_projections::command::{Command, CommandMeta};
    use vmplane_projections::{CommandOptions, Projections};
    use vmplane_store::{EventLog, SledLog};

    use super::*;

    const VMS: usize = 300;

    fn stream(i: usize) -> String {
        vmplane_projections::model::stream_of(Kind::VirtualMachine, "load", &format!("vm-{i}"))
    }

    #[test]
    fn many_reads_at_once_take_at_most_the_bound_of_drainers_and_each_lands_in_the_cache() {
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
                    r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"vm-{i}","namespace":"load"}},"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"devices":{{}}}}}}}}}}}}"#
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
        let loads = StateLoads::new(commands);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let read = runtime.block_on(async {
            let watcher = {
                let (loads, peak) = (Arc::clone(&loads), Arc::clone(&peak));
                tokio::spawn(async move {
                    loop {
                        peak.fetch_max(loads.drainers(), std::sync::atomic::Ordering::Relaxed);
                        tokio::task::yield_now().await;
                    }
                })
            };
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
            watcher.abort();
            read
        });
        assert!(read.iter().all(|r| *r), "every state was read");
        for i in 0..VMS {
            assert!(
                cache.cached(&stream(i), Kind::VirtualMachine, 1).is_some(),
                "vm-{i}'s state is in the cache"
            );
        }
        let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            (1..=loads.drainers_max).contains(&peak),
            "{peak} drainers at once, at most {}",
            loads.drainers_max
        );
        assert_eq!(
            loads.drainers(),
            0,
            "every drainer ended with the queue empty"
        );
    }
}

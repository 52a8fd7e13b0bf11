//! The processor scheduling policy of vmplane's own background threads (Linux; elsewhere
//! nothing changes).
//!
//! On a machine with as few processors as threads that are busy at once, the kernel's wake-up
//! preemption decides latency: a thread that is woken at the same priority as the one running
//! often takes its processor on the spot, in the middle of whatever it was doing. The threads
//! that vmplane wakes for every request (the file log's committer, the gateway's state readers
//! and its blocking threads) run under [`Policy::Batch`]: the same share of the processor as
//! any thread, but woken, they wait for the running thread's time slice to end. Threads whose
//! work can always wait (the projections' checkpoint writer and catch-up gate) run under
//! [`Policy::Idle`]. The threads every request waits for (the runtime's workers, the
//! projections' follower) keep the usual policy.
//!
//! A thread's policy is its own on Linux: setting it never changes another thread's.

/// A scheduling policy for the calling thread (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_BATCH`: an ordinary share of the processor, without preempting the thread
    /// running when it is woken.
    Batch,
    /// `SCHED_IDLE`: runs only when a processor has nothing else to run, and any thread that
    /// wakes takes the processor from it at once (a thread at nice 19 keeps it until its time
    /// slice ends: milliseconds that every request in flight would wait).
    Idle,
}

impl Policy {
    /// The policy's number in Linux's `sched_setscheduler(2)` and in field 41 of
    /// `/proc/<pid>/task/<tid>/stat`.
    #[cfg(target_os = "linux")]
    #[must_use]
    pub fn linux_number(self) -> i32 {
        match self {
            Policy::Batch => libc::SCHED_BATCH,
            Policy::Idle => libc::SCHED_IDLE,
        }
    }
}

/// Puts the calling thread under `policy`. Best effort: where the kernel refuses, or off
/// Linux, the thread stays as it was (it still works, only with the default policy's
/// latencies), and the refusal is logged at debug level.
pub fn run_this_thread_under(policy: Policy) {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a live, initialised value for the whole call, which only reads it;
        // pid 0 names the calling thread.
        let status = unsafe { libc::sched_setscheduler(0, policy.linux_number(), &param) };
        if status != 0 {
            tracing::debug!(
                ?policy,
                error = %std::io::Error::last_os_error(),
                "could not change this thread's scheduling policy"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = policy;
}

/// [`run_this_thread_under`] for a thread of a pool that runs other work too (tokio's blocking
/// threads): the first call on a thread sets `policy`, later calls cost a thread-local read
/// unless they ask for another one.
pub fn keep_this_thread_under(policy: Policy) {
    thread_local! {
        static SET: std::cell::Cell<Option<Policy>> = const { std::cell::Cell::new(None) };
    }
    SET.with(|set| {
        if set.get() != Some(policy) {
            run_this_thread_under(policy);
            set.set(Some(policy));
        }
    });
}

/// The calling thread's scheduling policy (Linux's number), or `None` where it cannot be read
/// (off Linux): for tests and diagnostics.
#[must_use]
pub fn policy_of_this_thread() -> Option<i32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getscheduler` takes a plain integer (0: the calling thread).
        let policy = unsafe { libc::sched_getscheduler(0) };
        (policy >= 0).then_some(policy)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The scheduling policies (Linux's numbers) of this process's threads named `name`, read from
/// `/proc/self/task`: for tests and diagnostics. Linux keeps the first 15 bytes of a thread's
/// name, so a longer `name` is compared by those (`projections-gate` as `projections-gat`).
/// Empty off Linux or when none has that name.
#[must_use]
pub fn policies_of_threads_named(name: &str) -> Vec<i32> {
    const KEPT: usize = 15;
    let name = &name.as_bytes()[..name.len().min(KEPT)];
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end_matches('\n').as_bytes() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis start at field 3; `policy` is 41.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if let Some(Ok(policy)) = rest.split_whitespace().nth(41 - 3).map(str::parse) {
            found.push(policy);
        }
    }
    found
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_changes_its_own_policy_and_no_one_elses() {
        for policy in [Policy::Batch, Policy::Idle] {
            let current = || policy_of_this_thread().expect("readable on Linux");
            let before = current();
            // Longer than the 15 bytes Linux keeps of a thread's name.
            let name = format!("vmplane-policy-{policy:?}");
            let (seen, listed) = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    run_this_thread_under(policy);
                    (current(), policies_of_threads_named(&name))
                })
                .expect("spawn")
                .join()
                .expect("the thread");
            assert_eq!(seen, policy.linux_number());
            assert_eq!(listed, vec![policy.linux_number()], "read from /proc");
            assert_eq!(current(), before, "the calling thread's policy changed");
        }
    }

    #[test]
    fn a_pooled_thread_is_put_under_a_policy_once_and_again_when_asked_for_another() {
        std::thread::spawn(|| {
            // Not back from `Idle`: leaving it needs CAP_SYS_NICE (tests may run unprivileged).
            for policy in [Policy::Batch, Policy::Batch, Policy::Idle, Policy::Idle] {
                keep_this_thread_under(policy);
                assert_eq!(policy_of_this_thread(), Some(policy.linux_number()));
            }
        })
        .join()
        .expect("the thread");
    }
}

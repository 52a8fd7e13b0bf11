//! Real etcd clusters for tests and probes (feature `harness`): members are `etcd` processes on
//! free loopback ports, each with its own data directory, started with `--initial-cluster`, and
//! stopped by PID.
//!
//! Cleanup: [`EtcdCluster`]'s `Drop` kills every member and removes the directory, also when a
//! test panics. A cluster that is never dropped (one kept in a `static` for a whole test binary)
//! is cleaned up by a watchdog shell started with it: when the test process is gone, it kills the
//! members whose PIDs it finds in the directory (checking they are etcd) and removes the
//! directory.
//!
//! Ports are never fixed: each start binds `127.0.0.1:0` to learn free ports, releases them and
//! hands them to etcd; if a port was taken in between (etcd exits with "address already in use"),
//! the start is retried on new ports.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

use crate::EtcdOptions;

/// Attempts at starting a cluster on fresh ports.
const START_ATTEMPTS_MAX: usize = 3;

/// Why the harness could not do what it was asked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HarnessError(pub String);

fn fail(message: impl Into<String>) -> HarnessError {
    HarnessError(message.into())
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster on loopback.
pub struct EtcdCluster {
    binary: PathBuf,
    dir: Option<tempfile::TempDir>,
    token: String,
    members: Vec<Member>,
    /// Extra `etcd` flags every member starts with.
    flags: Vec<String>,
    watchdog: Option<Child>,
}

impl fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .field("dir", &self.path())
            .finish()
    }
}

/// The `etcd` binary: `$VMPLANE_ETCD_BIN`, else the first `etcd` on `PATH`, else `/usr/bin/etcd`.
pub fn etcd_binary() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os("VMPLANE_ETCD_BIN") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(fail(format!(
                "VMPLANE_ETCD_BIN={} is not a file: run scripts/install-etcd.sh or fix the variable",
                path.display()
            )));
        }
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            fail(
                "etcd is not installed (no `etcd` on PATH or in /usr/bin): \
                 run scripts/install-etcd.sh",
            )
        })
}

fn free_ports(count: usize) -> Result<Vec<u16>, HarnessError> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|err| fail(format!("binding a free loopback port: {err}")))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|err| fail(format!("reading a bound port: {err}")))
}

impl EtcdCluster {
    /// Starts `members` members and waits until the cluster serves linearizable reads.
    pub fn start(members: usize) -> Result<EtcdCluster, HarnessError> {
        EtcdCluster::start_with_flags(members, &[])
    }

    /// Like [`EtcdCluster::start`], every member also started with `flags` (e.g.
    /// `["--max-txn-ops", "1024"]`), restarts included.
    pub fn start_with_flags(members: usize, flags: &[&str]) -> Result<EtcdCluster, HarnessError> {
        let binary = etcd_binary()?;
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS_MAX {
            match EtcdCluster::start_once(&binary, members, &flags) {
                Ok(cluster) => return Ok(cluster),
                Err(err) => last = err.0,
            }
        }
        Err(fail(format!(
            "could not start a {members}-member etcd cluster in {START_ATTEMPTS_MAX} attempts: {last}"
        )))
    }

    fn start_once(
        binary: &Path,
        count: usize,
        flags: &[String],
    ) -> Result<EtcdCluster, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("vmplane-etcd-")
            .tempdir()
            .map_err(|err| fail(format!("creating a temp dir: {err}")))?;
        let ports = free_ports(2 * count)?;
        let members = (0..count)
            .map(|i| Member {
                name: format!("e{}", i + 1),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            binary: binary.to_path_buf(),
            token: format!("vmplane-{}", uuid::Uuid::new_v4().simple()),
            dir: Some(dir),
            members,
            flags: flags.to_vec(),
            watchdog: None,
        };
        cluster.start_watchdog()?;
        for i in 0..count {
            cluster.spawn(i, "new")?;
        }
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// The temp directory holding the members' data and logs.
    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default()
    }

    /// Client URLs of every member.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URL of member `i` (0-based).
    #[must_use]
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Options for a log in `namespace` on this cluster, with short deadlines suited to tests.
    #[must_use]
    pub fn options(&self, namespace: &str) -> EtcdOptions {
        let mut options = EtcdOptions::new(self.endpoints(), namespace);
        options.request_timeout = Duration::from_millis(1500);
        options.unavailable_after = Duration::from_secs(8);
        options
    }

    /// The PID of member `i`, if it runs.
    #[must_use]
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Kills member `i` with SIGKILL (by its PID) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its ports and data directory (it rejoins as an existing
    /// member); does not wait for it.
    pub fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        if self.members[i].child.is_some() {
            return Ok(());
        }
        self.spawn(i, "existing")
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<(), HarnessError> {
        let dir = self.path();
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let log = dir.join(format!("{}.log", member.name));
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.stderr", member.name)))
            .map_err(|err| fail(format!("opening a log file: {err}")))?;
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(dir.join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", state])
            .args(["--logger", "zap"])
            .args(&self.flags)
            .arg("--log-outputs")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|err| fail(format!("starting {}: {err}", self.binary.display())))?;
        std::fs::write(
            dir.join(format!("{}.pid", member.name)),
            child.id().to_string(),
        )
        .map_err(|err| fail(format!("writing a PID file: {err}")))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Kills the members and removes the directory once this process is gone, whatever way it
    /// ends; `Drop` does the same earlier and stops the watchdog.
    fn start_watchdog(&mut self) -> Result<(), HarnessError> {
        let dir = self.path();
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             for f in '{dir}'/*.pid; do p=$(cat \"$f\" 2>/dev/null) || continue; \
             grep -q etcd /proc/$p/cmdline 2>/dev/null && kill -9 $p; done; \
             sleep 0.2; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = dir.display()
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| fail(format!("starting the cleanup watchdog: {err}")))?;
        self.watchdog = Some(child);
        Ok(())
    }

    /// Waits until a linearizable read through all endpoints succeeds (a leader and a quorum).
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), HarnessError> {
        let endpoints = self.endpoints();
        self.wait_serving(endpoints, timeout)
    }

    /// Waits until member `i` itself serves a linearizable read (it has rejoined and caught up
    /// enough to be published; before that it accepts connections but does not answer).
    pub fn wait_member(&mut self, i: usize, timeout: Duration) -> Result<(), HarnessError> {
        let endpoint = vec![self.endpoint(i)];
        self.wait_serving(endpoint, timeout)
    }

    fn wait_serving(
        &mut self,
        endpoints: Vec<String>,
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| fail(format!("starting a runtime: {err}")))?;
        let deadline = Instant::now() + timeout;
        let mut last = String::from("not tried");
        while Instant::now() < deadline {
            self.check_alive()?;
            let attempt = runtime.block_on(async {
                let options = ConnectOptions::new()
                    .with_require_leader(true)
                    .with_connect_timeout(Duration::from_millis(500))
                    .with_timeout(Duration::from_millis(1000));
                let mut client = Client::connect(&endpoints, Some(options)).await?;
                client.get("vmplane-harness-health", None).await
            });
            match attempt {
                Ok(_) => return Ok(()),
                Err(err) => last = err.to_string(),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(fail(format!(
            "etcd [{}] not serving after {} ms: {last}",
            endpoints.join(","),
            timeout.as_millis()
        )))
    }

    /// Fails if a started member has exited (a port clash, a bad flag), quoting its log.
    fn check_alive(&mut self) -> Result<(), HarnessError> {
        let dir = self.path();
        for member in &mut self.members {
            if let Some(child) = &mut member.child
                && let Ok(Some(status)) = child.try_wait()
            {
                member.child = None;
                let mut log = String::new();
                if let Ok(mut file) = File::open(dir.join(format!("{}.stderr", member.name))) {
                    let _ = file.read_to_string(&mut log);
                }
                let mut tail: String = log.chars().rev().take(600).collect();
                tail = tail.chars().rev().collect();
                return Err(fail(format!(
                    "etcd member {} exited ({status}): {tail}",
                    member.name
                )));
            }
        }
        Ok(())
    }

    /// Compacts the cluster's history up to its current revision (physically), as an operator
    /// or Kubernetes' apiserver would.
    pub fn compact(&self) -> Result<i64, HarnessError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| fail(format!("starting a runtime: {err}")))?;
        runtime
            .block_on(async {
                let mut client = Client::connect(self.endpoints(), None).await?;
                let revision = client
                    .get("vmplane-harness-health", None)
                    .await?
                    .header()
                    .map_or(0, |h| h.revision());
                client
                    .compact(
                        revision,
                        Some(etcd_client::CompactionOptions::new().with_physical()),
                    )
                    .await?;
                Ok::<_, etcd_client::Error>(revision)
            })
            .map_err(|err| fail(format!("compacting: {err}")))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        // Removes the data directories (TempDir's own Drop).
        self.dir.take();
    }
}

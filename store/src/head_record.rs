//! The durable head record: a small file beside an embedded log holding a recent durable head
//! and its chain hash, written with write + sync + rename + directory sync, at most every
//! [`HeadRecord::INTERVAL`] after a commit and at every clean close. Opening compares the log
//! with it, so a log that lost acknowledged events behind the backend's back (sled 0.34 dropping
//! a damaged tail; a file truncated or damaged in its last records) is an error, not a shorter
//! log presented as whole. Shared by both embedded backends.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::types::Position;

/// The record's file name in the log's directory.
pub const HEAD_RECORD_FILE: &str = "vmplane-head";

/// A log's head record.
pub(crate) struct HeadRecord {
    dir: PathBuf,
    /// When it was last written.
    written: Mutex<Instant>,
}

impl HeadRecord {
    /// How often commits refresh it.
    pub const INTERVAL: Duration = Duration::from_secs(1);

    pub fn new(dir: &Path) -> HeadRecord {
        HeadRecord {
            dir: dir.to_path_buf(),
            written: Mutex::new(Instant::now()),
        }
    }

    /// Checks a log whose durable head is `head` against the record (none: nothing to check).
    /// `hash_at(position)` is the chain hash the log holds at `position` (`None`: no event
    /// there).
    pub fn check(
        &self,
        head: u64,
        hash_at: impl FnOnce(u64) -> Result<Option<[u8; 32]>>,
    ) -> Result<()> {
        let path = self.dir.join(HEAD_RECORD_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(Error::Io {
                    context: "reading the head record",
                    source,
                });
            }
        };
        let malformed = || Error::Damaged {
            reason: format!("{} is malformed", path.display()),
        };
        let mut lines = text.lines();
        if lines.next() != Some("vmplane-head v1") {
            return Err(malformed());
        }
        let position: u64 = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(malformed)?;
        let hash = lines
            .next()
            .and_then(|l| hex::decode(l).ok())
            .ok_or_else(malformed)?;
        if position > head {
            return Err(Error::Damaged {
                reason: format!(
                    "the log ends at position {head}, but position {position} was committed: \
                     the log lost its tail (damaged or truncated files?)"
                ),
            });
        }
        if position > 0 && hash_at(position)?.is_none_or(|found| found[..] != hash[..]) {
            return Err(Error::Corrupt {
                position: Position(position),
                reason: "the event's hash differs from the one recorded when it was committed"
                    .into(),
            });
        }
        Ok(())
    }

    /// Writes `position` and its `hash` (write, sync, rename, sync the directory).
    pub fn write(&self, position: u64, hash: [u8; 32]) -> std::io::Result<()> {
        let text = format!("vmplane-head v1\n{position}\n{}\n", hex::encode(hash));
        let temp = self.dir.join(format!("{HEAD_RECORD_FILE}.tmp"));
        let mut file = File::create(&temp)?;
        std::io::Write::write_all(&mut file, text.as_bytes())?;
        file.sync_data()?;
        std::fs::rename(&temp, self.dir.join(HEAD_RECORD_FILE))?;
        *self.written.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        File::open(&self.dir)?.sync_all()
    }

    /// Writes the head `durable()` gives (`None`: nothing to write) if the record is older than
    /// [`HeadRecord::INTERVAL`]; a failure is logged, not returned (the record is a safety net).
    pub fn refresh(&self, durable: impl FnOnce() -> Option<(u64, [u8; 32])>) {
        {
            let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
            if written.elapsed() < Self::INTERVAL {
                return;
            }
            *written = Instant::now();
        }
        if let Some((position, hash)) = durable()
            && let Err(err) = self.write(position, hash)
        {
            tracing::warn!(%err, "could not refresh the head record");
        }
    }
}

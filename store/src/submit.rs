//! Appends handed to the log without waiting for them ([`crate::EventLog::submit`]): the caller
//! gets a future that completes once the append is durable (or refused), so an async caller
//! needs no thread of its own parked per append.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::Result;
use crate::types::{AppendRequest, AppendResult, Timestamp};

/// A durable append, as a submitted append reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Where its events are.
    pub result: AppendResult,
    /// The time recorded with its events (one per commit), or `None` when the backend does not
    /// say or nothing was written (`result.replayed`: the events are the original ones).
    pub recorded_at: Option<Timestamp>,
}

/// An append on its way to the log: completes with the same result [`crate::EventLog::append`]
/// would have returned. Dropping it does not withdraw the append.
pub struct PendingAppend(Pin<Box<dyn Future<Output = Result<Appended>> + Send>>);

impl PendingAppend {
    /// Wraps a backend's future.
    pub fn new(future: impl Future<Output = Result<Appended>> + Send + 'static) -> PendingAppend {
        PendingAppend(Box::pin(future))
    }
}

impl Future for PendingAppend {
    type Output = Result<Appended>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for PendingAppend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingAppend").finish_non_exhaustive()
    }
}

/// What [`crate::EventLog::submit`] did with a request.
#[derive(Debug)]
pub enum Submitted {
    /// Queued: await it.
    Pending(PendingAppend),
    /// This log has no such path (or it is not started): the request back, to be appended with
    /// [`crate::EventLog::append`] on a thread that may block.
    Unsupported(AppendRequest),
}

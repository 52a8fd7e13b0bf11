//! The crate's errors: a rejected spec with every cause, and hypervisor failures that name
//! the domain they were about.

use std::fmt;

use uuid::Uuid;

/// One thing wrong with a [`crate::DomainSpec`], at a field path such as `disks[1].target_dev`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecProblem {
    /// Where: a field path relative to the spec.
    pub field: String,
    /// What is wrong there.
    pub message: String,
}

impl SpecProblem {
    /// A problem at `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> SpecProblem {
        SpecProblem {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A spec vmplane will not render, with every problem found (never empty).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// Every problem, in field order.
    pub problems: Vec<SpecProblem>,
}

impl SpecError {
    pub(crate) fn single(field: &str, message: String) -> SpecError {
        SpecError {
            problems: vec![SpecProblem::new(field, message)],
        }
    }

    pub(crate) fn from_problems(problems: Vec<SpecProblem>) -> Result<(), SpecError> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SpecError { problems })
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", p.field, p.message)?;
        }
        Ok(())
    }
}

/// vmplane's metadata in a domain could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("vmplane metadata unreadable: {reason}")]
pub struct MetadataError {
    /// What was wrong.
    pub reason: String,
}

impl MetadataError {
    pub(crate) fn new(reason: impl Into<String>) -> MetadataError {
        MetadataError {
            reason: reason.into(),
        }
    }
}

/// A domain as errors name it: its UUID, and its name when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRef {
    /// The domain UUID (vmplane's firmware UUID).
    pub uuid: Uuid,
    /// The libvirt name, when known.
    pub name: Option<String>,
}

impl fmt::Display for DomainRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "domain {name:?} ({})", self.uuid),
            None => write!(f, "domain {}", self.uuid),
        }
    }
}

/// Why a [`crate::Hypervisor`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HypervisorError {
    /// The spec was rejected before libvirt saw it.
    #[error("invalid domain spec for {domain}: {source}")]
    InvalidSpec {
        /// The domain the spec was for.
        domain: DomainRef,
        /// Every problem.
        #[source]
        source: SpecError,
    },
    /// No domain with that UUID exists on this node.
    #[error("{domain} not found")]
    NotFound {
        /// The domain asked for.
        domain: DomainRef,
    },
    /// The domain exists but carries no vmplane metadata: vmplane never touches it.
    #[error("{domain} is not managed by vmplane (no vmplane metadata); refusing to {operation}")]
    NotOwned {
        /// The domain found.
        domain: DomainRef,
        /// What vmplane was about to do.
        operation: &'static str,
    },
    /// The domain carries vmplane's namespace, but its metadata cannot be read.
    #[error("{domain}: {source}")]
    Metadata {
        /// The domain.
        domain: DomainRef,
        /// What was wrong.
        #[source]
        source: MetadataError,
    },
    /// Opening a connection failed.
    #[error("cannot connect to {uri}: {source}")]
    Connect {
        /// The libvirt URI.
        uri: String,
        /// libvirt's error.
        #[source]
        source: virt::error::Error,
    },
    /// The node's connection closed (libvirtd restarted, the link went away) and the last
    /// attempt to reopen it failed; the next attempt comes once the back-off has passed
    /// (see [`crate::libvirt`]).
    #[error("the connection to {uri} is closed; reconnecting in {retry_in_ms} ms")]
    Reconnecting {
        /// The connection's URI.
        uri: String,
        /// How long until the next attempt.
        retry_in_ms: u64,
    },
    /// libvirt refused or failed a call about a domain.
    #[error("libvirt {operation} of {domain} failed: {source}")]
    Domain {
        /// The domain.
        domain: DomainRef,
        /// The libvirt call (`define`, `start`, …).
        operation: &'static str,
        /// libvirt's error.
        #[source]
        source: virt::error::Error,
    },
    /// libvirt refused the lifecycle-event registration when the connection was opened.
    #[error("lifecycle events are unavailable on {uri}")]
    EventsUnavailable {
        /// The connection's URI.
        uri: String,
    },
    /// A thread (the reconciler's, or an event forwarder) could not be started.
    #[error("cannot start a thread: {reason}")]
    Thread {
        /// The operating system's error.
        reason: String,
    },
    /// libvirt failed a call about the node (listing, node info).
    #[error("libvirt {operation} on {uri} failed: {source}")]
    Node {
        /// The connection's URI.
        uri: String,
        /// The libvirt call.
        operation: &'static str,
        /// libvirt's error.
        #[source]
        source: virt::error::Error,
    },
}

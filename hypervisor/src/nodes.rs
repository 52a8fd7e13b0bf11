//! [`Nodes`]: the named hypervisor connections vmplane drives, and [`place`], which picks a
//! node for a VMI.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::error::HypervisorError;
use crate::hypervisor::{Hypervisor, Resources};
use crate::libvirt::LibvirtHypervisor;

/// One node: a name, its hypervisor connection, and its capacity as read when it was opened.
#[derive(Clone)]
pub struct Node {
    /// The node's name (unique among the nodes).
    pub name: String,
    /// Its hypervisor.
    pub hypervisor: Arc<dyn Hypervisor>,
    /// vCPUs and memory it offers to domains.
    pub capacity: Resources,
    /// Its labels, which a VMI's `spec.nodeSelector` matches: Kubernetes' well-known
    /// `kubernetes.io/hostname` (its name) and `kubernetes.io/os` (`linux`).
    pub labels: BTreeMap<String, String>,
}

/// The labels every node has ([`Node::labels`]).
pub fn node_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (HOSTNAME_LABEL.to_owned(), name.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
    ])
}

/// The label naming a node.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// Why a set of nodes could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodesError {
    /// A node argument is not `name=URI`.
    #[error("{arg:?} is not a node: expected NAME=URI, e.g. node1=test:///default")]
    Syntax {
        /// The argument as given.
        arg: String,
    },
    /// Two nodes have the same name.
    #[error("node {name:?} is given twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// A node's connection or capacity query failed.
    #[error("node {name:?}: {source}")]
    Hypervisor {
        /// The node.
        name: String,
        /// What failed.
        #[source]
        source: Box<HypervisorError>,
    },
}

impl NodesError {
    /// What to check, for a message that ends with a hint: the URI and libvirt for a node that
    /// cannot be opened, the arguments otherwise.
    pub fn hint(&self) -> &'static str {
        match self {
            NodesError::Hypervisor { .. } => "check the URI and that libvirt serves it",
            NodesError::Syntax { .. } => "give each node as NAME=URI",
            NodesError::Duplicate { .. } => "give each node a name of its own",
        }
    }
}

/// Several named nodes, in the order they were given.
#[derive(Clone, Debug, Default)]
pub struct Nodes {
    nodes: Vec<Node>,
}

impl Nodes {
    /// Opens one libvirt connection per `name=URI` argument (e.g. `a=test:///default`,
    /// `b=qemu:///system`) and reads each node's capacity. Blocks. The arguments are checked
    /// (syntax, a name given twice) before any connection is opened.
    pub fn open<S: AsRef<str>>(args: &[S]) -> Result<Nodes, NodesError> {
        let mut parsed: Vec<(String, String)> = Vec::with_capacity(args.len());
        for arg in args {
            let arg = arg.as_ref();
            match arg.split_once('=') {
                Some((name, _)) if parsed.iter().any(|(n, _)| n == name) => {
                    // Said before any connection is opened: a mistake in the arguments, not
                    // in libvirt.
                    return Err(NodesError::Duplicate {
                        name: name.to_owned(),
                    });
                }
                Some((name, uri)) if !name.is_empty() && !uri.is_empty() => {
                    parsed.push((name.to_owned(), uri.to_owned()));
                }
                _ => {
                    return Err(NodesError::Syntax {
                        arg: arg.to_owned(),
                    });
                }
            }
        }
        let mut nodes = Nodes::default();
        for (name, uri) in parsed {
            let hypervisor =
                LibvirtHypervisor::open(&uri).map_err(|source| NodesError::Hypervisor {
                    name: name.clone(),
                    source: Box::new(source),
                })?;
            nodes.add(name, Arc::new(hypervisor))?;
        }
        Ok(nodes)
    }

    /// Adds a node on any [`Hypervisor`], reading its capacity. Blocks.
    pub fn add(&mut self, name: String, hypervisor: Arc<dyn Hypervisor>) -> Result<(), NodesError> {
        if self.get(&name).is_some() {
            return Err(NodesError::Duplicate { name });
        }
        let capacity = hypervisor
            .node_capacity()
            .map_err(|source| NodesError::Hypervisor {
                name: name.clone(),
                source: Box::new(source),
            })?;
        self.nodes.push(Node {
            labels: node_labels(&name),
            name,
            hypervisor,
            capacity,
        });
        Ok(())
    }

    /// The node called `name`.
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The nodes in the order they were given.
    pub fn iter(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter()
    }

    /// Picks a node for `request` given what is already placed (see [`place`]), among the
    /// nodes whose labels hold every pair of `selector` (a VMI's `spec.nodeSelector`).
    pub fn place<'a>(
        &self,
        request: Resources,
        placed: impl IntoIterator<Item = (&'a str, Resources)>,
        selector: &BTreeMap<String, String>,
    ) -> Result<&Node, Unschedulable> {
        self.place_reachable(request, placed, selector, &[])
    }

    /// [`Nodes::place`] leaving out the nodes named in `unreachable` (whose listing failed:
    /// a VMI placed there would wait for a node that may not come back, while another has
    /// room). When nothing fits, [`Unschedulable::unreachable`] names the matching nodes left
    /// out.
    pub fn place_reachable<'a>(
        &self,
        request: Resources,
        placed: impl IntoIterator<Item = (&'a str, Resources)>,
        selector: &BTreeMap<String, String>,
        unreachable: &[String],
    ) -> Result<&Node, Unschedulable> {
        let matching: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
            .collect();
        if matching.is_empty() && !self.nodes.is_empty() {
            return Err(Unschedulable {
                request,
                nodes: Vec::new(),
                unmatched_selector: Some((selector.clone(), self.nodes.len())),
                unreachable: Vec::new(),
            });
        }
        let (reachable, left_out): (Vec<&Node>, Vec<&Node>) = matching
            .into_iter()
            .partition(|n| !unreachable.contains(&n.name));
        let name = place(
            reachable.iter().map(|n| (n.name.as_str(), n.capacity)),
            placed,
            request,
        )
        .map_err(|mut e| {
            e.unreachable = left_out.iter().map(|n| n.name.clone()).collect();
            e
        })?;
        // `place` only answers names it was given.
        self.get(&name).ok_or(Unschedulable {
            request,
            nodes: Vec::new(),
            unmatched_selector: None,
            unreachable: Vec::new(),
        })
    }
}

/// No node has room for a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Unschedulable {
    /// What was asked for.
    pub request: Resources,
    /// Every node with what it had free.
    pub nodes: Vec<(String, Resources)>,
    /// The selector no node matched, and how many nodes there are, when that is the reason.
    pub unmatched_selector: Option<(BTreeMap<String, String>, usize)>,
    /// Nodes that would match but were left out as unreachable.
    pub unreachable: Vec<String>,
}

/// What starts the free capacity at the end of an [`Unschedulable`]'s text.
const FREE_PREFIX: &str = " (free:";

impl Unschedulable {
    /// Why nothing fits, without what each node had free: the same for as long as the
    /// reasons are the same, while the free figures change with every VMI placed or
    /// stopped elsewhere. Its text is the start of the [`fmt::Display`] text, which adds
    /// ` (free: …)`.
    pub fn reasons(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = fmt::Write::write_fmt(&mut out, format_args!("{}", Reasons(self)));
        out
    }

    /// The reasons part of a message written from an [`Unschedulable`] (its whole text but
    /// the free capacity at the end): what [`Unschedulable::reasons`] gives for the same
    /// reasons.
    pub fn reasons_of(message: &str) -> &str {
        message
            .rfind(FREE_PREFIX)
            .map_or(message, |at| &message[..at])
    }
}

/// The [`Unschedulable::reasons`] of an `Unschedulable`.
struct Reasons<'a>(&'a Unschedulable);

impl fmt::Display for Reasons<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let u = self.0;
        if let Some((selector, nodes)) = &u.unmatched_selector {
            // Kubernetes' scheduler's words.
            write!(
                f,
                "0/{nodes} nodes are available: {nodes} node(s) didn't match the VMI's \
                 nodeSelector ("
            )?;
            for (i, (k, v)) in selector.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                write!(f, "{sep}{k}={v}")?;
            }
            return f.write_str(")");
        }
        write!(
            f,
            "no node has {} vCPUs and {} bytes of memory free",
            u.request.vcpus, u.request.memory_bytes
        )?;
        if !u.unreachable.is_empty() {
            write!(
                f,
                "; {} node(s) unreachable: {}",
                u.unreachable.len(),
                u.unreachable.join(", ")
            )?;
        } else if u.nodes.is_empty() {
            f.write_str(" (there are no nodes)")?;
        }
        Ok(())
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Reasons(self))?;
        if self.unmatched_selector.is_some() || self.nodes.is_empty() {
            return Ok(());
        }
        f.write_str(FREE_PREFIX)?;
        for (name, free) in &self.nodes {
            write!(
                f,
                " {name}: {} vCPUs, {} bytes;",
                free.vcpus, free.memory_bytes
            )?;
        }
        f.write_str(")")
    }
}

/// Picks a node for `request`.
///
/// A node fits when its capacity minus the sum of what is already placed on it (`placed`:
/// node name and resources, one entry per placed domain; names of unknown nodes are ignored)
/// leaves room for both the vCPUs and the memory asked for; vCPUs are not overcommitted.
/// Among the nodes that fit it picks the one with the most memory left after placing, then
/// the most vCPUs left, then the first given — so load spreads and the answer is
/// deterministic. None fits → [`Unschedulable`], listing what each node had free.
pub fn place<'n, 'p>(
    capacities: impl IntoIterator<Item = (&'n str, Resources)>,
    placed: impl IntoIterator<Item = (&'p str, Resources)>,
    request: Resources,
) -> Result<String, Unschedulable> {
    let mut free: Vec<(String, Resources)> = capacities
        .into_iter()
        .map(|(name, capacity)| (name.to_owned(), capacity))
        .collect();
    for (node, used) in placed {
        if let Some((_, left)) = free.iter_mut().find(|(name, _)| name == node) {
            left.vcpus = left.vcpus.saturating_sub(used.vcpus);
            left.memory_bytes = left.memory_bytes.saturating_sub(used.memory_bytes);
        }
    }
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, (_, left))| {
            left.vcpus >= request.vcpus && left.memory_bytes >= request.memory_bytes
        })
        .max_by_key(|(i, (_, left))| {
            (
                left.memory_bytes - request.memory_bytes,
                left.vcpus - request.vcpus,
                std::cmp::Reverse(*i),
            )
        })
        .map(|(_, (name, _))| name.clone());
    best.ok_or(Unschedulable {
        request,
        nodes: free,
        unmatched_selector: None,
        unreachable: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn res(vcpus: u32, gib: u64) -> Resources {
        Resources {
            vcpus,
            memory_bytes: gib * GIB,
        }
    }

    #[test]
    fn spreads_then_fills_then_reports_unschedulable() {
        let nodes = [("a", res(4, 4)), ("b", res(2, 8))];
        let mut placed: Vec<(String, Resources)> = Vec::new();
        let want = res(1, 2);
        let mut order = Vec::new();
        loop {
            match place(nodes, placed.iter().map(|(n, r)| (n.as_str(), *r)), want) {
                Ok(node) => {
                    order.push(node.clone());
                    placed.push((node, want));
                }
                Err(unschedulable) => {
                    assert_eq!(unschedulable.request, want);
                    assert_eq!(
                        unschedulable.nodes,
                        vec![("a".into(), res(2, 0)), ("b".into(), res(0, 4))]
                    );
                    break;
                }
            }
        }
        // b has the most memory left until its vCPUs run out; then a takes the rest.
        assert_eq!(order, ["b", "b", "a", "a"]);
    }

    #[test]
    fn vcpus_alone_can_make_a_node_full() {
        let nodes = [("a", res(1, 64))];
        assert!(place(nodes, [("a", res(1, 1))], res(1, 1)).is_err());
        assert_eq!(
            place(nodes, [("zz", res(1, 1))], res(1, 1)),
            Ok("a".to_owned())
        );
    }

    /// Audit: 20 VMs too big for any node recorded one observation each per start or stop of
    /// an unrelated VM, differing only in the free figures. The reasons leave them out.
    #[test]
    fn the_reasons_leave_out_the_free_figures_that_change_with_every_placement() {
        let busy = place([("n1", res(2, 2))], [("n1", res(1, 1))], res(4, 1))
            .expect_err("4 vCPUs fit nowhere");
        let idle = place([("n1", res(2, 2))], [], res(4, 1)).expect_err("4 vCPUs fit nowhere");
        assert_ne!(busy.to_string(), idle.to_string());
        assert_eq!(busy.reasons(), idle.reasons());
        assert_eq!(
            busy.reasons(),
            "no node has 4 vCPUs and 1073741824 bytes of memory free"
        );
        assert!(busy.to_string().starts_with(&busy.reasons()));
        assert!(busy.to_string().contains("(free: n1: 1 vCPUs"), "{busy}");
        assert_eq!(Unschedulable::reasons_of(&busy.to_string()), busy.reasons());
        // Another reason is another text, and so is a selector nothing matches.
        let mut left_out = idle.clone();
        left_out.unreachable = vec!["remote".into()];
        assert_eq!(
            left_out.reasons(),
            "no node has 4 vCPUs and 1073741824 bytes of memory free; 1 node(s) unreachable: \
             remote"
        );
        assert_eq!(
            Unschedulable::reasons_of(&left_out.to_string()),
            left_out.reasons()
        );
        let selector = Unschedulable {
            request: res(1, 1),
            nodes: Vec::new(),
            unmatched_selector: Some((BTreeMap::from([("disk".into(), "ssd".into())]), 2)),
            unreachable: Vec::new(),
        };
        assert_eq!(selector.reasons(), selector.to_string());
        assert_eq!(
            Unschedulable::reasons_of(&selector.to_string()),
            selector.reasons()
        );
    }

    #[test]
    fn no_nodes_is_unschedulable() {
        let err = place([], [], res(1, 1)).expect_err("nothing fits on no nodes");
        assert!(err.to_string().contains("there are no nodes"), "{err}");
    }
}

//! Nodes from `name=URI` arguments, capacity from libvirt, placement until nothing fits.

use vmplane_hypervisor::{Nodes, NodesError, Resources};

use crate::common::{GIB, PrivateNode, minimal_spec};

#[test]
fn placement_fills_the_nodes_then_reports_unschedulable() {
    let big = PrivateNode::with_capacity(4, 4 * 1024 * 1024);
    let small = PrivateNode::with_capacity(2, 2 * 1024 * 1024);
    let nodes = Nodes::open(&[format!("big={}", big.uri), format!("small={}", small.uri)])
        .expect("open nodes");
    let capacities: Vec<(&str, Resources)> = nodes
        .iter()
        .map(|n| (n.name.as_str(), n.capacity))
        .collect();
    assert_eq!(
        capacities,
        [
            (
                "big",
                Resources {
                    vcpus: 4,
                    memory_bytes: 4 * GIB
                }
            ),
            (
                "small",
                Resources {
                    vcpus: 2,
                    memory_bytes: 2 * GIB
                }
            )
        ]
    );

    let mut placed: Vec<(String, Resources)> = Vec::new();
    let unschedulable = loop {
        let mut spec = minimal_spec("default", &format!("vm{}", placed.len()));
        spec.memory_bytes = GIB;
        let request = Resources::of(&spec);
        match nodes.place(
            request,
            placed.iter().map(|(n, r)| (n.as_str(), *r)),
            &spec.node_selector,
        ) {
            Ok(node) => {
                node.hypervisor.define(&spec).expect("define");
                node.hypervisor.start(spec.firmware_uuid).expect("start");
                placed.push((node.name.clone(), request));
            }
            Err(e) => break e,
        }
        assert!(placed.len() <= 6, "more placed than fits");
    };
    assert_eq!(placed.len(), 6, "4 on big + 2 on small");
    assert!(
        unschedulable
            .nodes
            .iter()
            .all(|(_, free)| free.vcpus == 0 && free.memory_bytes == 0),
        "{unschedulable}"
    );
    for node in nodes.iter() {
        let on_node = placed.iter().filter(|(n, _)| *n == node.name).count();
        assert_eq!(
            node.hypervisor.list_owned().expect("list").len(),
            on_node,
            "{}",
            node.name
        );
    }
}

#[test]
fn a_node_selector_places_only_on_nodes_with_its_labels_and_none_matching_is_unschedulable() {
    let a = PrivateNode::with_capacity(4, 4 * 1024 * 1024);
    let b = PrivateNode::with_capacity(4, 4 * 1024 * 1024);
    let nodes = Nodes::open(&[format!("a={}", a.uri), format!("b={}", b.uri)]).expect("open nodes");
    let mut spec = minimal_spec("default", "pinned");
    // Without a selector the roomier-first rule picks a (the first of equals).
    let any = nodes
        .place(Resources::of(&spec), [], &spec.node_selector)
        .expect("a node");
    assert_eq!(any.name, "a");
    spec.node_selector = [("kubernetes.io/hostname".to_owned(), "b".to_owned())].into();
    let pinned = nodes
        .place(Resources::of(&spec), [], &spec.node_selector)
        .expect("node b");
    assert_eq!(pinned.name, "b");
    assert_eq!(pinned.labels["kubernetes.io/os"], "linux");
    spec.node_selector = [("disktype".to_owned(), "ssd".to_owned())].into();
    let err = nodes
        .place(Resources::of(&spec), [], &spec.node_selector)
        .expect_err("no node has disktype=ssd");
    assert_eq!(
        err.to_string(),
        "0/2 nodes are available: 2 node(s) didn't match the VMI's nodeSelector (disktype=ssd)"
    );
}

#[test]
fn node_arguments_are_checked() {
    let a = PrivateNode::empty();
    assert!(matches!(
        Nodes::open(&["no-equals-sign"]),
        Err(NodesError::Syntax { .. })
    ));
    assert!(matches!(
        Nodes::open(&[format!("={}", a.uri)]),
        Err(NodesError::Syntax { .. })
    ));
    assert!(matches!(
        Nodes::open(&[format!("a={}", a.uri), format!("a={}", a.uri)]),
        Err(NodesError::Duplicate { .. })
    ));
    assert!(matches!(
        Nodes::open(&["a=test:///nonexistent/dir/node.xml"]),
        Err(NodesError::Hypervisor { .. })
    ));
}

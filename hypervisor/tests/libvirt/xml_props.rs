//! Property: for any VM name, namespace and labels, the rendered XML parses, has exactly the
//! expected element structure (nothing injected), and the metadata round-trips exactly; text
//! XML cannot carry (control characters) is rejected at its field instead.

use std::collections::BTreeMap;

use proptest::prelude::*;
use uuid::Uuid;
use vmplane_hypervisor::{
    DomainName, InstanceMetadata, METADATA_NAMESPACE_URI, parse_metadata, render_domain,
};

use crate::common::full_spec;

/// Text biased toward what breaks XML: metacharacters, CDATA ends, entity look-alikes, our own
/// tags, unicode, and (rarely) control characters.
fn nasty_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => Just("<".to_owned()),
        4 => Just(">".to_owned()),
        4 => Just("&".to_owned()),
        4 => Just("'".to_owned()),
        4 => Just("\"".to_owned()),
        3 => Just("]]>".to_owned()),
        2 => Just("<![CDATA[".to_owned()),
        2 => Just("&amp;".to_owned()),
        2 => Just("&#x41;".to_owned()),
        2 => Just("</vmplane:name><vmplane:namespace>x".to_owned()),
        2 => Just("<!-- c -->".to_owned()),
        2 => Just("<?pi x?>".to_owned()),
        2 => Just(" ".to_owned()),
        6 => "[a-z0-9.-]{1,6}",
        3 => any::<char>().prop_map(String::from),
        1 => prop::sample::select(vec!['\0', '\t', '\n', '\r', '\u{7f}', '\u{85}', '\u{fffe}'])
            .prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|parts| parts.concat())
}

fn metadata() -> impl Strategy<Value = InstanceMetadata> {
    (
        nasty_text(),
        nasty_text(),
        any::<u128>(),
        prop::collection::btree_map(nasty_text(), nasty_text(), 0..4),
    )
        .prop_map(|(name, namespace, uid, labels)| InstanceMetadata {
            name,
            namespace,
            vmi_uid: Uuid::from_u128(uid),
            labels,
        })
}

/// The fields whose text XML cannot carry, as `validate` names them.
fn expected_problem_fields(meta: &InstanceMetadata) -> Vec<String> {
    let bad = |s: &str| {
        s.chars()
            .any(|c| c.is_control() || matches!(c, '\u{fffe}' | '\u{ffff}'))
    };
    let mut fields = Vec::new();
    for (field, text) in [
        ("metadata.name", &meta.name),
        ("metadata.namespace", &meta.namespace),
    ] {
        if text.is_empty() || bad(text) {
            fields.push(field.to_owned());
        }
    }
    for (key, value) in &meta.labels {
        let field = format!("metadata.labels[{key:?}]");
        if key.is_empty() || bad(key) {
            fields.push(field.clone());
        }
        if bad(value) {
            fields.push(field);
        }
    }
    fields
}

fn element_names<'a>(node: roxmltree::Node<'a, 'a>) -> Vec<(Option<&'a str>, &'a str)> {
    node.children()
        .filter(|n| n.is_element())
        .map(|n| (n.tag_name().namespace(), n.tag_name().name()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn metadata_renders_without_injection_and_round_trips(meta in metadata()) {
        let mut spec = full_spec("default", "prop");
        spec.name = DomainName::for_instance(&meta.namespace, &meta.name);
        prop_assert!(DomainName::parse(spec.name.as_str()).is_ok());
        spec.metadata = meta.clone();
        let expected_problems = expected_problem_fields(&meta);
        let xml = match render_domain(&spec) {
            Err(e) => {
                let fields: Vec<String> = e.problems.iter().map(|p| p.field.clone()).collect();
                prop_assert_eq!(fields, expected_problems);
                return Ok(());
            }
            Ok(xml) => {
                prop_assert!(expected_problems.is_empty(), "rendered despite {:?}", expected_problems);
                xml
            }
        };
        let doc = roxmltree::Document::parse(&xml)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{xml}")))?;
        let root = doc.root_element();
        prop_assert_eq!(root.tag_name().name(), "domain");
        let top: Vec<&str> = element_names(root).into_iter().map(|(_, n)| n).collect();
        prop_assert_eq!(top, [
            "name", "uuid", "metadata", "memory", "vcpu", "sysinfo", "os", "features", "cpu",
            "on_poweroff", "on_reboot", "on_crash", "devices",
        ]);
        let metadata_el = root.children().find(|n| n.has_tag_name("metadata")).expect("metadata");
        let ns = Some(METADATA_NAMESPACE_URI);
        prop_assert_eq!(element_names(metadata_el), [(ns, "instance")]);
        let instance = metadata_el.first_element_child().expect("instance");
        prop_assert_eq!(instance.attributes().count(), 0);
        let mut expected = vec![(ns, "name"), (ns, "namespace"), (ns, "vmi-uid")];
        if !meta.labels.is_empty() {
            expected.push((ns, "labels"));
        }
        prop_assert_eq!(element_names(instance), expected);
        let text = |name: &str| {
            instance.children().find(|n| n.has_tag_name((METADATA_NAMESPACE_URI, name)))
                .map(|n| n.text().unwrap_or("").to_owned())
        };
        prop_assert_eq!(text("name"), Some(meta.name.clone()));
        prop_assert_eq!(text("namespace"), Some(meta.namespace.clone()));
        let mut labels = BTreeMap::new();
        if let Some(labels_el) = instance.children().find(|n| n.has_tag_name((METADATA_NAMESPACE_URI, "labels"))) {
            for label in labels_el.children().filter(|n| n.is_element()) {
                prop_assert_eq!(label.tag_name().name(), "label");
                prop_assert_eq!(label.attributes().map(|a| a.name()).collect::<Vec<_>>(), ["key"]);
                prop_assert_eq!(label.children().filter(|n| n.is_element()).count(), 0);
                labels.insert(
                    label.attribute("key").unwrap_or_default().to_owned(),
                    label.text().unwrap_or_default().to_owned(),
                );
            }
        }
        prop_assert_eq!(&labels, &meta.labels);
        // Nowhere else in the document did anything appear from the metadata.
        prop_assert_eq!(doc.descendants().filter(|n| n.is_element() && n.tag_name().namespace() == ns).count(),
            4 + usize::from(!meta.labels.is_empty()) + meta.labels.len());
        prop_assert_eq!(doc.descendants().filter(|n| n.is_comment() || n.is_pi()).count(), 0);
        // vmplane's own parser reads back exactly what was written.
        prop_assert_eq!(parse_metadata(&xml), Ok(Some(meta)));
    }
}

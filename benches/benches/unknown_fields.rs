//! The unknown-field check `apply` runs on every manifest ([`vmplane_core::schema`]), on the
//! repository's `examples/vm.yaml` as JSON (what gRPC clients send): the one-pass check of the
//! text (the apply path's), against parsing the text into a JSON tree and walking it (the path
//! for YAML and for a text the one pass declines), and against parsing the text alone (the
//! baseline: what reading it once costs).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vmplane_core::schema;
use vmplane_core::types::parse_documents;

fn example_vm_json() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vm.yaml");
    let text = std::fs::read(path).expect("examples/vm.yaml");
    let doc = parse_documents(&text)
        .expect("examples/vm.yaml parses")
        .remove(0);
    doc.to_string()
}

fn unknown_fields(c: &mut Criterion) {
    let text = example_vm_json();
    assert_eq!(schema::warnings_of_json(&text), Some(Vec::new()));
    let mut g = c.benchmark_group("unknown_fields");
    g.bench_function("one_pass_over_the_text", |b| {
        b.iter(|| schema::warnings_of_json(black_box(&text)))
    });
    g.bench_function("tree_then_walk", |b| {
        b.iter(|| {
            let docs = parse_documents(black_box(text.as_bytes())).expect("parses");
            schema::warnings(&docs[0])
        })
    });
    g.bench_function("baseline_serde_json_tree", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(black_box(&text)).expect("parses"))
    });
    g.finish();
}

criterion_group!(benches, unknown_fields);
criterion_main!(benches);

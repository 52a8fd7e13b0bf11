//! # vmplane-benches
//!
//! Criterion benchmarks (`cargo bench -p vmplane-benches`) and load generators. Each benchmark
//! measures a baseline in the same run (raw sled insert + flush, a bare fdatasync) so that its
//! figures can be read as ratios on any machine.

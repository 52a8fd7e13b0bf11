//! # vmplane-projections
//!
//! **Owns** the read models that are folded from the log: VM and VMI current state (with status
//! computed from events, never stored), revision history, indexes (name, firmware UUID, feature
//! usage, instancetype revision), time travel, checkpoints and rebuild.
//!
//! **Must never** append events (writes go through the command path in `gateway`), or hold a
//! second truth: everything here can be thrown away and rebuilt from position 0.
//!
//! Status: the crate boundary exists; the read models are built in the projections issue
//! (see `ARCHITECTURE.md`).

//! End-to-end tests of the real `vmplane` binary. One module per area.

mod fixtures;
mod metrics;
mod serve;

#!/usr/bin/env bash
# Installs what is missing and runs the whole test suite: formatting, lints, every test of every
# crate (unit, contract, crash and end-to-end tests against real components).
#
#   scripts/test.sh                # the README's test command; .ci/run runs it
#   VMPLANE_SKIP_LINT=1 scripts/test.sh   # tests only
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
# Real QEMU through a libvirtd the hypervisor tests start themselves.
bash scripts/install-qemu.sh >/dev/null
# A 3-member etcd cluster the store-etcd tests start themselves.
bash scripts/install-etcd.sh
source scripts/rustflags.sh

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi

# Fault-injection points are compiled in only for their own test binaries.
FAILPOINTS=vmplane-store/failpoints,vmplane-projections/failpoints,vmplane-hypervisor/failpoints

if [ "${VMPLANE_SKIP_LINT:-0}" != 1 ]; then
  echo "== cargo fmt --check" >&2
  cargo fmt --all -- --check
  echo "== cargo clippy" >&2
  cargo clippy --locked --workspace --all-targets -- -D warnings
  cargo clippy --locked -p vmplane-store -p vmplane-projections -p vmplane-hypervisor \
    --features "$FAILPOINTS" --all-targets -- -D warnings
fi

echo "== cargo test" >&2
cargo build --locked -p vmplane-gateway --bin vmplane
status=0
cargo test --locked --workspace --no-fail-fast || status=$?
echo "== fault injection" >&2
cargo test --locked -p vmplane-store -p vmplane-projections -p vmplane-hypervisor \
  --features "$FAILPOINTS" --test failpoints || status=$?
echo "== fuzz targets (bounded: seeds, mutations, random inputs)" >&2
(cd fuzz && cargo test --locked --test fuzz -- --nocapture) || status=$?
exit $status

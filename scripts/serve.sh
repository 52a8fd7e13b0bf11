#!/usr/bin/env bash
# Installs what is missing, builds vmplane, and runs `vmplane serve` on its defaults
# (data in ./vmplane-data, listening on 127.0.0.1:50051). Extra arguments go to `vmplane serve`.
#
#   scripts/serve.sh                       # the README's run command
#   scripts/serve.sh --listen 127.0.0.1:0  # any `vmplane serve` flag
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/rustflags.sh
cargo build --release --locked -p vmplane-gateway --bin vmplane
# Where cargo put it: its own target directory unless CARGO_TARGET_DIR says otherwise.
exec "${CARGO_TARGET_DIR:-target}/release/vmplane" serve "$@"

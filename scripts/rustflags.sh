# Sourced by serve.sh and test.sh. The server's runtime needs the `tokio_unstable` cfg, which
# .cargo/config.toml sets; a RUSTFLAGS variable replaces the config's flags, so when one is set
# the cfg is added to it.
if [ -n "${RUSTFLAGS:-}" ] && [[ "$RUSTFLAGS" != *tokio_unstable* ]]; then
  export RUSTFLAGS="$RUSTFLAGS --cfg tokio_unstable"
fi

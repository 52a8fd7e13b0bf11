#!/usr/bin/env bash
# Installs etcd (server and etcdctl) from Debian for vmplane's etcd backend, skipping what is
# present. Idempotent. The store-etcd tests start their own 3-member cluster on free loopback
# ports with this binary; nothing is started here (the package starts no service without systemd,
# and on a systemd host the tests never use the packaged service's ports).
#
#   scripts/install-etcd.sh          # install what is missing
#   scripts/install-etcd.sh --check  # install nothing; exit 1 and say what is missing
#
# Debian 12 ships etcd 3.4.23 (reference: shared/reference/etcd-backend.md §1). The etcd-client
# crate compiles etcd's protos at build time: it needs protoc (protobuf-compiler) *and* the
# well-known types it imports (google/protobuf/descriptor.proto, struct.proto), which Debian ships
# in libprotobuf-dev, a mere recommendation of protobuf-compiler that --no-install-recommends
# skips (without it: "google/protobuf/descriptor.proto: File not found").
# Every apt call waits for another apt on a shared machine instead of failing.
set -euo pipefail

check_only=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "install-etcd: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# package -> a command or file that proves it is installed
pkgs=(
  "etcd-server:etcd"
  "etcd-client:etcdctl"
  "protobuf-compiler:protoc"
  "libprotobuf-dev:/usr/include/google/protobuf/descriptor.proto"
)

missing=()
for entry in "${pkgs[@]}"; do
  pkg=${entry%%:*}; proof=${entry#*:}
  if ! command -v "$proof" >/dev/null 2>&1 && [ ! -e "$proof" ] \
     && ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$check_only" = 1 ]; then
  echo "install-etcd: missing ${missing[*]} (run scripts/install-etcd.sh)" >&2
  exit 1
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-etcd: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "install-etcd: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"

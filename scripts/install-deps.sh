#!/usr/bin/env bash
# Installs the system packages vmplane needs to build, run and test, skipping what is present.
# Idempotent; safe to run on every invocation of the README commands.
#
#   scripts/install-deps.sh            # build + run: protoc, libvirt (client library + test driver)
#   scripts/install-deps.sh --test     # also what the test suite needs (virt-xml-validate, ...)
#
# Every apt call waits for another apt on a shared machine instead of failing.
set -euo pipefail

want_test=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# package -> a file or command that proves it is installed
pkgs=(
  "protobuf-compiler:/usr/bin/protoc"
  "libprotobuf-dev:/usr/include/google/protobuf/descriptor.proto"
  "pkg-config:/usr/bin/pkg-config"
  # a C compiler: the linker, and mimalloc (the binary's allocator) is C
  "gcc:/usr/bin/cc"
  "libvirt-dev:/usr/lib/x86_64-linux-gnu/pkgconfig/libvirt.pc"
  "libvirt-clients:/usr/bin/virsh"
)
if [ "$want_test" = 1 ]; then
  pkgs+=("libxml2-utils:/usr/bin/xmllint")
fi

missing=()
for entry in "${pkgs[@]}"; do
  pkg=${entry%%:*}; proof=${entry#*:}
  if [ ! -e "$proof" ] && ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

# libvirt's pkg-config file lives under the multiarch dir; check by pkg-config too.
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"

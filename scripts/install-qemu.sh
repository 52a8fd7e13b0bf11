#!/usr/bin/env bash
# Installs what real QEMU domains through libvirtd need on Debian 12, skipping what is present.
# Idempotent. Needs root. Used by the real-QEMU test of vmplane-hypervisor
# (hypervisor/tests/libvirt/qemu.rs), which starts virtlogd and libvirtd itself.
#
#   scripts/install-qemu.sh          # install; prints the emulator path at the end
#   scripts/install-qemu.sh --check  # install nothing; exit 1 and say what is missing
#
# What it installs (reference: shared/reference/libvirt-and-tonic.md §2):
#   * libvirt-daemon-system (--no-install-recommends): libvirtd, virtlogd, and the
#     libvirt-qemu user and kvm group QEMU's driver resolves before reading qemu.conf.
#   * QEMU for x86_64. If `qemu-system-x86` installs cleanly it is installed as usual. On this
#     image it does not: the preinstalled qemu-utils from bookworm-backports
#     (Breaks: qemu-system-common << 1:8.0) conflicts. Then, as the reference did, without
#     touching the image's qemu-utils: the Depends of qemu-system-x86 and qemu-system-common
#     (firmware: seabios, ipxe-qemu, qemu-system-data; libraries) are installed from apt, and the
#     two QEMU packages themselves are downloaded and unpacked into $VMPLANE_QEMU_ROOT
#     (default /opt/vmplane-qemu). QEMU is relocatable: it finds its firmware in ../share/qemu
#     (symlinked to the installed firmware) and its modules (the TCG accelerator) in
#     ../lib/x86_64-linux-gnu/qemu, relative to the binary.
#   * /dev/kvm: group kvm, mode 0660 (what udev does on a real host). Without it libvirt
#     re-probes QEMU on every call (seconds each), because KVM "is not available now" to the
#     libvirt-qemu user.
#
# Every apt call waits for another apt on a shared machine instead of failing.
set -euo pipefail

check_only=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "install-qemu: unknown argument $arg" >&2; exit 2 ;;
  esac
done

root=${VMPLANE_QEMU_ROOT:-/opt/vmplane-qemu}
# --no-remove: never let apt make room by removing a package (apt would otherwise resolve the
# qemu-utils conflict by removing the image's qemu-utils).
apt_opts=(-y -o DPkg::Lock::Timeout=600 --no-install-recommends --no-remove)
updated=0
missing=()

say() { echo "install-qemu: $*" >&2; }

apt_update_once() {
  if [ "$updated" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    updated=1
  fi
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if [ "$(id -u)" != 0 ] && [ "$check_only" = 0 ]; then
  say "must run as root (it installs packages)"
  exit 1
fi

# --- libvirt-daemon-system ---------------------------------------------------------------
if installed libvirt-daemon-system && command -v libvirtd >/dev/null 2>&1 \
    && getent passwd libvirt-qemu >/dev/null; then
  say "libvirt-daemon-system: present"
elif [ "$check_only" = 1 ]; then
  missing+=("libvirt-daemon-system")
else
  say "installing libvirt-daemon-system"
  apt_update_once
  apt-get install "${apt_opts[@]}" libvirt-daemon-system
fi

# --- QEMU --------------------------------------------------------------------------------
emulator=""
if command -v qemu-system-x86_64 >/dev/null 2>&1; then
  emulator=$(command -v qemu-system-x86_64)
  say "qemu-system-x86_64: present at $emulator"
elif [ -x "$root/usr/bin/qemu-system-x86_64" ] && [ -e "$root/usr/share/qemu/bios-256k.bin" ]; then
  emulator="$root/usr/bin/qemu-system-x86_64"
  say "qemu-system-x86_64: present at $emulator (private root)"
elif [ "$check_only" = 1 ]; then
  missing+=("qemu-system-x86")
else
  apt_update_once
  # Installs as usual only if apt needs to remove nothing for it (--no-remove in apt_opts).
  if apt-get install -s "${apt_opts[@]}" qemu-system-x86 >/dev/null 2>&1; then
    say "installing qemu-system-x86"
    apt-get install "${apt_opts[@]}" qemu-system-x86
    emulator=$(command -v qemu-system-x86_64)
  else
    say "qemu-system-x86 conflicts with the installed qemu-utils ($(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || echo '?'));"
    say "unpacking QEMU into $root instead, leaving qemu-utils alone"
    version=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ {print $2}')
    if [ -z "$version" ] || [ "$version" = "(none)" ]; then
      say "apt knows no qemu-system-x86 candidate"
      exit 1
    fi
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # apt downloads as user _apt where it can.
    if getent passwd _apt >/dev/null; then chown _apt "$work"; fi
    (cd "$work" && apt-get -o DPkg::Lock::Timeout=600 download \
      "qemu-system-x86=$version" "qemu-system-common=$version")
    # The first alternative of every Depends of both packages, without version constraints,
    # except the QEMU packages themselves (unpacked below).
    deps=$(for deb in "$work"/*.deb; do dpkg-deb -f "$deb" Depends; done \
      | tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/[[:space:]]//g' \
      | grep -v -e '^$' -e '^qemu-system-common$' -e '^qemu-system-x86$' | sort -u)
    # Only what is missing: naming an installed library would upgrade it and mark it manual.
    need=()
    for dep in $deps; do installed "$dep" || need+=("$dep"); done
    if [ "${#need[@]}" -gt 0 ]; then
      say "installing QEMU's dependencies: ${need[*]}"
      apt-get install "${apt_opts[@]}" "${need[@]}"
    fi
    mkdir -p "$root"
    for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$root"; done
    # Firmware where the relocated binary looks for it (../share/qemu): the installed
    # qemu-system-data, seabios and ipxe files, symlinked by absolute path.
    mkdir -p "$root/usr/share/qemu"
    for f in /usr/share/qemu/* /usr/share/seabios/*.bin /usr/lib/ipxe/qemu/*.rom; do
      [ -e "$f" ] || continue
      target="$root/usr/share/qemu/$(basename "$f")"
      [ -e "$target" ] || ln -s "$f" "$target"
    done
    emulator="$root/usr/bin/qemu-system-x86_64"
    if ! "$emulator" --version >/dev/null; then
      say "the unpacked emulator does not run: $emulator --version failed"
      exit 1
    fi
  fi
fi

# --- /dev/kvm permissions ----------------------------------------------------------------
if [ -e /dev/kvm ]; then
  if [ "$(stat -c '%G %a' /dev/kvm)" = "kvm 660" ]; then
    say "/dev/kvm: group kvm, mode 0660"
  elif [ "$check_only" = 1 ]; then
    missing+=("/dev/kvm group kvm rw")
  elif getent group kvm >/dev/null; then
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
    say "/dev/kvm: set group kvm, mode 0660"
  fi
else
  say "/dev/kvm: absent; domains run with TCG (type='qemu') only"
fi

if [ "${#missing[@]}" -gt 0 ]; then
  say "missing: ${missing[*]}"
  exit 1
fi
say "ready; emulator: $emulator"
echo "$emulator"

#!/usr/bin/env bash
# The README's two commands on a truly fresh Debian (issue 16, part 1).
# Builds Debian bookworm (debootstrap --variant=minbase, plus git, make and
# ca-certificates) in a chroot under the CI folder, clones this repository's
# committed HEAD into it and runs exactly `make run` and `make test` there, so
# a missing install step in tools/deps.sh or the Makefile fails CI.
# Needs root and debootstrap on the host. Env: FRESH_DEBIAN_DIR (chroot folder,
# default .ci-work/bookworm), DEBIAN_MIRROR, DPAR_REQUIRE_BACKENDS and
# DPAR_REQUIRE_TOOLS (passed in).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
root=${FRESH_DEBIAN_DIR:-$repo/.ci-work/bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v debootstrap >/dev/null || { echo "FAIL fresh-debian: debootstrap not installed"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "FAIL fresh-debian: needs root (chroot, mounts)"; exit 1; }

mounts=()
cleanup() {
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mnt() { # mnt <mount args...> <target>
    mount "$@"
    mounts+=("${*: -1}")
}

rm -rf "$root"
mkdir -p "$root"
echo "== fresh-debian: debootstrap bookworm (minbase) into $root"
debootstrap --variant=minbase --include=git,make,ca-certificates bookworm "$root" "$mirror" >"$root.log" 2>&1 ||
    { tail -20 "$root.log"; echo "FAIL fresh-debian: debootstrap"; exit 1; }

# The chroot reaches Debian's packages the way this host does (same sources,
# same Acquire settings); nothing else of the host is copied in.
cp /etc/resolv.conf "$root/etc/resolv.conf"
if [ -d /etc/apt/sources.list.d ]; then cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" 2>/dev/null || true; fi
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then : >"$root/etc/apt/sources.list"; fi
for f in /etc/apt/apt.conf.d/*; do grep -q '^Acquire::' "$f" 2>/dev/null && cp "$f" "$root/etc/apt/apt.conf.d/"; done

mnt -t proc proc "$root/proc"
mnt --rbind /dev "$root/dev"
mnt -t tmpfs tmpfs "$root/dev/shm"
mnt -t sysfs sysfs "$root/sys"

git clone -q --no-local "$repo" "$root/root/dpar"
echo "== fresh-debian: make run && make test (as the README says)"
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DPAR_REQUIRE_BACKENDS="${DPAR_REQUIRE_BACKENDS:-}" DPAR_REQUIRE_TOOLS="${DPAR_REQUIRE_TOOLS:-}" \
    bash -c 'cd /root/dpar && make run && make test' 2>&1 | tee "$root.run.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then echo "FAIL fresh-debian: make run / make test exited with $rc"; exit 1; fi
echo "PASS fresh-debian: $(grep -E '^[0-9]+ passed' "$root.run.log" | tail -1)"

#!/usr/bin/env bash
# Runs as PID 1 of a fresh PID + mount namespace (unshare --fork --pid --mount --mount-proc).
# Builds a throwaway root: an overlay of the host's / whose writes go to a tmpfs, with its
# own /tmp, /run and /var/tmp (tmpfs), so systemd's boot-time clean-ups (tmpfiles --remove,
# --clean) and every install step (dpkg, sysusers, units) touch nothing on the host.
# Then it execs systemd in it. $1: the repo to bind read-only at /src; $2: a host directory
# bound at /out for results; $3 (optional): a host directory bound at /opt/venvs/rasd, so the
# service's venv survives between runs (pip is the slow part of the test).
set -euo pipefail
src=$1 out=$2 venv=${3:-}
# Nothing mounted here may propagate back to the host's mount namespace.
mount --make-rprivate /
# The scratch space (a tmpfs on /mnt, private to this namespace): overlay upper layer and root.
mount -t tmpfs -o mode=0755,size=3g tmpfs /mnt
base=/mnt/sysd-root
mkdir -p "$base/upper" "$base/work" "$base/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$base/upper,workdir=$base/work" "$base/root"
r=$base/root
# The mount points, whatever the host's / has at those names (a stray file /out once stopped
# the test): removed in the overlay only, never on the host.
for d in src out; do
    [ -d "$r/$d" ] && [ ! -L "$r/$d" ] || rm -f "$r/$d"
done
mkdir -p "$r/src" "$r/out"
mount --bind "$src" "$r/src"   # (src and out may live under the host's /tmp: bind them first)
mount -o remount,bind,ro "$r/src"
mount --bind "$out" "$r/out"
if [ -n "$venv" ]; then
    mkdir -p "$r/opt/venvs/rasd"
    mount --bind "$venv" "$r/opt/venvs/rasd"
fi
# Our own /tmp, in this namespace and in the new root, BEFORE systemd starts: the host's /tmp
# is shared with other people's processes, and systemd's boot-time tmpfiles clean-up empties
# the /tmp it sees.
mount -t tmpfs -o mode=1777 tmpfs /tmp
for d in tmp run var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs "$r/$d"
done
chmod 0755 "$r/run"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
# A machine id of its own (systemd wants one) and no host services: boot rasd-test.target.
echo 0123456789abcdef0123456789abcdef >"$r/etc/machine-id"
mkdir -p "$r/etc/systemd/system"
cat >"$r/etc/systemd/system/rasd-test.target" <<'UNIT'
[Unit]
Description=rasd systemd test: minimal boot
Requires=basic.target sockets.target
After=basic.target
AllowIsolate=yes
UNIT
touch "$r/out/.booting"
cd "$r"
if [ -n "${NSROOT_DRY:-}" ]; then exec chroot "$r" /bin/sh -c "$NSROOT_DRY"; fi
exec chroot "$r" /lib/systemd/systemd --system --unit=rasd-test.target --log-target=console --log-level=warning

#!/usr/bin/env bash
# `make systemd-test`: boot a real systemd in its own PID and mount namespaces and run
# tests/systemd/scenarios.sh inside it (see docs/operations.md, "Proven under systemd").
#
# Safety: the namespace gets a throwaway root (an overlay of / whose writes land in a tmpfs)
# with its OWN /tmp, /run and /var/tmp, mounted before systemd starts (tests/systemd/nsroot.sh),
# so systemd's boot-time tmpfiles clean-up and every install step touch nothing on the host.
# A marker file in the host's /tmp is checked afterwards.
#
# Skips (exit 0, saying why) where the machine cannot do it: not root, no unshare/nsenter,
# no /lib/systemd/systemd, no overlayfs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${SYSTEMD_TEST_OUT:-$ROOT/.systemd-test}
# The manual layout's venv (/opt/venvs/rasd inside), kept between runs; empty it to rebuild.
VENV_CACHE=${SYSTEMD_TEST_VENV:-$ROOT/.systemd-test-venv}
skip() { echo "systemd-test: SKIPPED: $*"; exit 0; }

[ "$(id -u)" = 0 ] || skip "needs root (to unshare PID and mount namespaces and boot systemd)"
command -v unshare >/dev/null || skip "no unshare(1) (util-linux)"
command -v nsenter >/dev/null || skip "no nsenter(1) (util-linux)"
[ -x /lib/systemd/systemd ] || skip "no /lib/systemd/systemd (apt-get install systemd)"
[ -x /usr/bin/python3 ] || skip "no /usr/bin/python3 for the service's venv (it must not live under /root or /home)"
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || skip "no overlayfs in this kernel"
[ -x "$ROOT/.venv/bin/python" ] || skip "no $ROOT/.venv (make .venv/.installed)"
if [ -e /run/systemd/system ] && [ "$(readlink -f /proc/1/exe)" = "$(readlink -f /lib/systemd/systemd)" ] && [ -z "${SYSTEMD_TEST_FORCE:-}" ]; then
    : # systemd is the host's init: still fine, the test boots its own in a new PID namespace
fi

marker=$(mktemp /tmp/rasd-systemd-test-marker.XXXXXX)
echo "host /tmp marker" >"$marker"
rm -rf "$OUT"
mkdir -p "$OUT" ${VENV_CACHE:+"$VENV_CACHE"}
# The package, when `make deb` built one: install it, and upgrade in place to a copy of it
# with a higher version (repacked with dpkg-deb) under load.
DEB=$(ls "$ROOT"/build/deb/rasd_*.deb 2>/dev/null | head -1 || true)
RASD_DEB= RASD_DEB_UPGRADE=
if [ -n "$DEB" ] && [ -z "${SYSTEMD_TEST_MANUAL:-}" ]; then
    RASD_DEB=/src/${DEB#"$ROOT"/}
    work=$OUT/repack
    dpkg-deb -R "$DEB" "$work"
    sed -i 's/^Version: \(.*\)$/Version: \1+upgrade1/' "$work/DEBIAN/control"
    dpkg-deb -Zgzip -b "$work" "$OUT/rasd_upgrade.deb" >/dev/null
    rm -rf "$work"
    RASD_DEB_UPGRADE=/out/rasd_upgrade.deb
    VENV_CACHE=  # the package brings its own /opt/venvs/rasd (and purge must remove it)
    echo "systemd-test: package $DEB (upgrade to $(dpkg-deb -f "$OUT/rasd_upgrade.deb" Version))"
else
    echo "systemd-test: no build/deb/rasd_*.deb (make deb): testing the manual layout"
fi
setsid unshare --fork --pid --mount --mount-proc bash "$ROOT/tests/systemd/nsroot.sh" "$ROOT" "$OUT" "$VENV_CACHE" \
    >"$OUT/boot.log" 2>&1 </dev/null &
UNSHARE=$!
PID1=

cleanup() {
    local rc=$?
    if [ -n "$PID1" ] && kill -0 "$PID1" 2>/dev/null; then
        kill -9 "$PID1" 2>/dev/null || true  # ends every process of the namespace
    fi
    wait "$UNSHARE" 2>/dev/null || true
    if [ ! -f "$marker" ]; then
        echo "systemd-test: FAILED: the host's /tmp was touched (marker $marker is gone)" >&2
        rc=1
    fi
    rm -f "$marker"
    exit $rc
}
trap cleanup EXIT

for _ in $(seq 200); do
    PID1=$(pgrep -P "$UNSHARE" || true)
    [ -n "$PID1" ] && [ -e "$OUT/.booting" ] && break
    sleep 0.05
done
[ -n "$PID1" ] || { echo "systemd-test: FAILED: the namespace did not start"; cat "$OUT/boot.log"; exit 1; }
inside() { nsenter -t "$PID1" -m -p -r -w "$@"; }
state=
for _ in $(seq 300); do
    state=$(inside systemctl is-system-running 2>/dev/null || true)
    case "$state" in running|degraded) break ;; esac
    sleep 0.1
done
case "$state" in
    running|degraded) ;;
    *) echo "systemd-test: FAILED: systemd did not boot (state: ${state:-none})"; tail -50 "$OUT/boot.log"; exit 1 ;;
esac
echo "systemd-test: $(inside /lib/systemd/systemd --version | head -1) booted as PID 1 of a new PID namespace (host pid $PID1)"
rc=0
inside env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    RASD_DEB="$RASD_DEB" RASD_DEB_UPGRADE="$RASD_DEB_UPGRADE" \
    RASD_SYSTEMD_STRICT="${RASD_SYSTEMD_STRICT:-}" \
    bash /src/tests/systemd/scenarios.sh || rc=$?
[ -f "$marker" ] || { echo "systemd-test: FAILED: host /tmp marker gone"; rc=1; }
echo "systemd-test: results in $OUT/results.txt"
exit $rc

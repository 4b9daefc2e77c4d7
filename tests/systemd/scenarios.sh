#!/usr/bin/env bash
# Runs INSIDE the test namespace (tests/systemd/run.sh), with systemd as PID 1 and a throwaway
# root. Installs rasd (the .deb in $RASD_DEB if given, else the documented manual layout),
# points it at moto's server on loopback, and goes through the scenarios of docs/operations.md.
# Every figure goes to /out/results.txt; a broken promise is a FAIL line and exit 1.
set -uo pipefail
SRC=/src OUT=/out
RES=$OUT/results.txt
: >"$RES"
FAILS=0
say() { echo "[$(date +%T)] $*"; }
record() { echo "$*" | tee -a "$RES"; }
fail() { record "FAIL: $*"; FAILS=$((FAILS + 1)); }
check() { local what=$1; shift; if "$@"; then record "ok: $what"; else fail "$what"; fi; }
# Two kinds of promise. Correctness (check/fail, always): the socket stays open, no request
# is dropped (load.py's "dropped": a connection closed twice before a reply, or no socket),
# and a hand-over or an upgrade under load fails no call at all. Timing (miss: a FAIL only
# with RASD_SYSTEMD_STRICT=1, else a MISS line with the figure): callers that wait for a new
# process's start-up with the client's default 1 s timeout (activation, `systemctl restart`,
# kill -9), which depends on how fast this (shared, overloaded) machine starts Python.
miss() { if [ -n "${RASD_SYSTEMD_STRICT:-}" ]; then fail "$*"; else record "MISS: $*"; fi; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
TOOLPY=$SRC/.venv/bin/python           # the developer venv: moto, boto3 (test tools only)
export AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_DEFAULT_REGION=us-east-1
PORT=$($TOOLPY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ENDPOINT=http://127.0.0.1:$PORT

# ------------------------------------------------------------------------------ install
install_manual() {
    say "manual install (docs/operations.md, other distributions): venv in /opt/venvs/rasd"
    mkdir -p /tmp/build
    tar -C "$SRC" --exclude=./.venv --exclude=./.git --exclude=./.systemd-test \
        --exclude=./bench/results --exclude=./build -cf - . | tar -C /tmp/build -xf -
    local stamp
    stamp=$(sha256sum "$SRC/pyproject.toml" | cut -c1-16)
    if [ "$(cat /opt/venvs/rasd/.stamp 2>/dev/null)" = "$stamp" ]; then
        # dependencies unchanged since the last run: reinstall rasd itself only
        /opt/venvs/rasd/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall \
            /tmp/build >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; return 1; }
    else
        rm -rf /opt/venvs/rasd/* /opt/venvs/rasd/.stamp
        /usr/bin/python3 -m venv /opt/venvs/rasd
        /opt/venvs/rasd/bin/pip install -q --disable-pip-version-check /tmp/build >"$OUT/pip.log" 2>&1 \
            || { cat "$OUT/pip.log"; return 1; }
        echo "$stamp" >/opt/venvs/rasd/.stamp
    fi
    for cmd in rasd rasadmin ras-liberator ras-dedupe ras-balancer; do
        ln -sf /opt/venvs/rasd/bin/$cmd /usr/bin/$cmd
    done
    install -D -m0644 "$SRC/systemd/rasd.sysusers.conf" /usr/lib/sysusers.d/rasd.conf
    install -D -m0644 "$SRC/systemd/rasd.service" /lib/systemd/system/rasd.service
    install -D -m0644 "$SRC/systemd/rasd.socket" /lib/systemd/system/rasd.socket
    install -D -m0644 "$SRC/systemd/rasd.toml.example" /etc/rasd/rasd.toml
    systemd-sysusers
    systemctl daemon-reload
    systemctl enable rasd.socket
}
if [ -n "${RASD_DEB:-}" ]; then
    say "installing the package $RASD_DEB"
    check "apt install ./rasd_*.deb" apt-get install -y -q "$RASD_DEB" >"$OUT/apt.log" 2>&1
    check "the package enabled and started rasd.socket" test "$(systemctl is-active rasd.socket)" = active
    check "the package created users rasd and rasd-clients" getent group rasd-clients
    check "/usr/bin/rasd and the jobs' commands" bash -c 'for c in rasd rasadmin ras-liberator ras-dedupe ras-balancer; do command -v $c >/dev/null || exit 1; done'
    check "moto is not in the package" bash -c '! /opt/venvs/rasd/bin/python -c "import moto" 2>/dev/null'
    mode=$(stat -c '%U:%G %a' /etc/default/rasd)
    check "/etc/default/rasd (AWS keys) is root:rasd 640 ($mode)" test "$mode" = "root:rasd 640"
    check "the package ships the metadata service's firewall rule" test -f /usr/share/rasd/rasd-imds.nft
    if command -v nft >/dev/null; then  # checked, not loaded: the host's network is shared
        check "nft accepts it (the rasd user exists)" nft -c -f /usr/share/rasd/rasd-imds.nft
    fi
    systemctl stop rasd.socket
else
    install_manual || { fail "manual install"; exit 1; }
fi
msg=$(rasd dev --dir /tmp/devcheck 2>&1); rc=$?
record "rasd dev on a production install: exit $rc: $msg"
dev_check() { [ "$rc" = 2 ] && [ "$(printf '%s\n' "$msg" | wc -l)" = 1 ] && [[ "$msg" == *"[dev]"* ]]; }
check "rasd dev without moto: one line naming the [dev] extra, exit 2" dev_check

acl_msg=$(rasd check-config --config /etc/rasd/rasd.toml 2>&1); acl_rc=$?
record "rasd check-config on the shipped rasd.toml: exit $acl_rc: $acl_msg"
acl_check() { [ "$acl_rc" = 2 ] && [[ "$acl_msg" == *"no [acl]"* ]] && [[ "$acl_msg" == *"acl_open = true"* ]]; }
check "the shipped rasd.toml (no [acl]) is refused until the site lists who may call: exit 2" acl_check

# The site's config: moto on loopback, the ACL, and the service's environment file.
cat >/etc/rasd/rasd.toml <<TOML
table = "rasd"
region = "us-east-1"
endpoint_url = "$ENDPOINT"
startup_retry_initial = 0.5
startup_retry_max = 2.0
# this machine's kernel keeps no synchronised clock: moto's Date header (this host's) alone
clock_check = "date"
[acl]
"uid.0" = ["*"]
"group.rasd-clients" = ["demo"]
TOML
printf 'AWS_ACCESS_KEY_ID=x\nAWS_SECRET_ACCESS_KEY=x\n' >/etc/default/rasd
# Shorter watchdog for the test's run time only (shipped: WatchdogSec=10).
mkdir -p /etc/systemd/system/rasd.service.d
printf '[Service]\nWatchdogSec=3\n' >/etc/systemd/system/rasd.service.d/test-watchdog.conf
systemctl daemon-reload
check "rasd check-config reads /etc/rasd/rasd.toml and /etc/default/rasd" \
    rasd check-config --config /etc/rasd/rasd.toml >/dev/null

# ------------------------------------------------------------------------------ moto
MOTO_RUNS=0
start_moto() {
    MOTO_RUNS=$((MOTO_RUNS + 1))
    # Nice=-10: the fake DynamoDB must not be the bottleneck of a shared, overloaded machine
    # (the daemon runs at Nice=-5); DynamoDB failures are still counted apart by load.py.
    systemd-run -q --unit=moto-$MOTO_RUNS -p Environment=PYTHONPATH=$SRC -p Nice=-10 \
        $TOOLPY -c "import time; from rasd.devtools import motoserver; motoserver.start(port=$PORT); time.sleep(86400)"
    for _ in $(seq 100); do
        $TOOLPY -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
check "moto on $ENDPOINT" start_moto
seed() {
PYTHONPATH=$SRC $TOOLPY - <<PY
import boto3
from rasd.core import schema
ddb = boto3.client("dynamodb", endpoint_url="$ENDPOINT", region_name="us-east-1")
schema.create_table(ddb, "rasd")
for c in ("demo", "other"):
    schema.put_pool(ddb, "rasd", c, "default", 86400)
    schema.add_resources(ddb, "rasd", c, "default", "us-east-1", (f"{c}-{i:05d}" for i in range(400)))
PY
}
seed

PY=/opt/venvs/rasd/bin/python
# 40 hot keys: after a restart the new process refills its cache with one Query per key.
load() { $PY $SRC/tests/systemd/load.py --keys 40 "$@"; }
failed_of() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["failed"])'; }
dynamodb_of() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["dynamodb"])'; }
dropped_of() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["dropped"])'; }
mainpid() { systemctl show -p MainPID --value rasd.service; }
wait_active() {
    for _ in $(seq 300); do
        [ "$(systemctl is-active rasd.service)" = active ] && return 0
        sleep 0.1
    done
    return 1
}
wait_served() {  # a call with a generous timeout succeeds
    for _ in $(seq 100); do
        $PY -c 'import rasd_client, datetime; rasd_client.get_lease("demo","default","probe",datetime.timedelta(hours=1),timeout=5)' 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# -------------------------------------------------------------------- 1. socket activation
say "1. socket activation"
systemctl start rasd.socket
check "socket active, service not started yet" test "$(systemctl is-active rasd.service)" != active
t0=$(now)
out=$(load --calls 1 --threads 1)
record "activation: spawn-to-first-answer $(since "$t0") s with the default 1 s timeout: $out"
[ "$(echo "$out" | failed_of)" = 0 ] && record "ok: first call after activation answered within the default timeout" \
    || miss "first call after activation failed with the default 1 s timeout"
check "service active after the first call" wait_active
check "served with a generous timeout" wait_served
for i in 1 2 3; do
    systemctl stop rasd.service; sleep 0.2
    t0=$(now); out=$(load --calls 1 --threads 1)
    record "activation #$i: spawn-to-first-answer $(since "$t0") s, failed=$(echo "$out" | failed_of)"
done
wait_active

# ---------------------------------------------------------------- 2. socket group and [acl]
say "2. socket group and [acl]"
perm=$(stat -c '%U:%G %a' /run/rasd/rasd.sock)
check "socket is root:rasd-clients 660 ($perm)" test "$perm" = "root:rasd-clients 660"
useradd -M -s /usr/sbin/nologin appuser 2>/dev/null; usermod -aG rasd-clients appuser
useradd -M -s /usr/sbin/nologin outsider 2>/dev/null
probe='import sys, rasd_client, datetime
try:
    rasd_client.get_lease(sys.argv[1], "default", "acl-probe", datetime.timedelta(hours=1), timeout=5); print("OK")
except rasd_client.RasdError as e: print(e.code)
except OSError as e: print(type(e).__name__)'
check "rasd-clients member may use demo" test "$(setpriv --reuid appuser --regid appuser --init-groups $PY -c "$probe" demo)" = OK
check "rasd-clients member gets FORBIDDEN for other" test "$(setpriv --reuid appuser --regid appuser --init-groups $PY -c "$probe" other)" = FORBIDDEN
r=$(setpriv --reuid outsider --regid outsider --init-groups $PY -c "$probe" demo)
check "non-member cannot connect ($r)" test "$r" = PermissionError -o "$r" = UNAVAILABLE

# ------------------------------------------------------------------------------ 3. reload
say "3. reload"
pid=$(mainpid)
systemctl reload rasd.service
check "reload keeps the process ($pid) and serves" test "$(mainpid)" = "$pid"
check "served after reload" wait_served

# --------------------------------------------------------------- 4. restart under load
say "4. restart under load"
INODE=$(stat -c %i /run/rasd/rasd.sock)
# lease the hot keys once (generous timeout), so the runs below measure restarts only
$PY - <<'WARM'
import datetime, rasd_client
for i in range(40):
    rasd_client.get_lease("demo", "default", f"k-{i}", datetime.timedelta(hours=1), timeout=10)
WARM
load --calls 2000 --threads 4 --pace 0.01 --started /tmp/l4 >"$OUT/restart.json" &
lp=$!
for _ in $(seq 100); do [ -e /tmp/l4 ] && break; sleep 0.05; done
sleep 0.5
t0=$(now)
systemctl restart rasd.service
record "restart: systemctl restart returned after $(since "$t0") s"
wait $lp
out=$(cat "$OUT/restart.json")
record "restart under load: $out"
n=$(echo "$out" | failed_of)
check "restart under load dropped no call ($(echo "$out" | dropped_of) dropped)" test "$(echo "$out" | dropped_of)" = 0
[ "$n" = 0 ] && record "ok: restart under load failed no call" \
    || miss "restart under load: $n of 2000 calls waited longer than 1 s for the new process's start-up"
check "socket stayed the same inode across restart" test "$(stat -c %i /run/rasd/rasd.sock)" = "$INODE"

# ------------------------------------------------------------- 4b. hand-over under load
say "4b. hand-over (SIGUSR2) under load"
wait_active; wait_served
load --calls 2000 --threads 4 --pace 0.01 --started /tmp/l4b --until /tmp/l4b.done >"$OUT/handover.json" &
lp=$!
for _ in $(seq 100); do [ -e /tmp/l4b ] && break; sleep 0.05; done
sleep 0.5
pid=$(mainpid)
t0=$(now)
systemctl kill -s USR2 --kill-who=main rasd.service
for _ in $(seq 600); do p2=$(mainpid); [ "$p2" != "$pid" ] && [ "$p2" != 0 ] && break; sleep 0.1; done
record "hand-over: main pid $pid -> $(mainpid) after $(since "$t0") s"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
record "hand-over: old process gone after $(since "$t0") s"
sleep 1; touch /tmp/l4b.done
wait $lp
out=$(cat "$OUT/handover.json")
record "hand-over under load: $out"
check "hand-over replaced the main process" test "$(mainpid)" != "$pid" -a "$(mainpid)" != 0
check "hand-over: the old process exited" bash -c "! kill -0 $pid 2>/dev/null"
n=$(echo "$out" | failed_of); nd=$(echo "$out" | dynamodb_of)
check "hand-over under load: no call failed but for DynamoDB ($((n - nd)) of $n failed otherwise)" test "$((n - nd))" = 0
[ "$n" = 0 ] && record "ok: hand-over under load failed no call at all" \
    || miss "hand-over under load: $nd calls failed because DynamoDB (moto on this machine) was slow or failing"
check "service active after the hand-over" test "$(systemctl is-active rasd.service)" = active
check "socket stayed the same inode across the hand-over" test "$(stat -c %i /run/rasd/rasd.sock)" = "$INODE"

# ------------------------------------------------------------------------------ 5. kill -9
say "5. kill -9 under load"
load --calls 2000 --threads 4 --pace 0.01 --started /tmp/l5 >"$OUT/kill9.json" &
lp=$!
for _ in $(seq 100); do [ -e /tmp/l5 ] && break; sleep 0.05; done
sleep 0.5
t0=$(now)
systemctl kill -s KILL rasd.service
wait_active; wait_served
record "kill -9: serving again after $(since "$t0") s"
wait $lp
out=$(cat "$OUT/kill9.json")
record "kill -9 under load: $out"
n=$(echo "$out" | failed_of)
check "kill -9 dropped at most the 4 calls in flight ($(echo "$out" | dropped_of) dropped)" test "$(echo "$out" | dropped_of)" -le 4
[ "$n" -le 4 ] && record "ok: kill -9 failed $n calls (4 threads: at most the in-flight ones)" \
    || miss "kill -9 failed $n calls (more than the 4 in flight: callers queued during the restart waited longer than 1 s)"
check "socket still active after kill -9" test "$(systemctl is-active rasd.socket)" = active

# ------------------------------------------------------------------------------ 6. watchdog
say "6. watchdog (SIGSTOP)"
pid=$(mainpid)
t0=$(now)
kill -STOP "$pid"
for _ in $(seq 300); do [ "$(mainpid)" != "$pid" ] && [ "$(mainpid)" != 0 ] && break; sleep 0.1; done
wait_active; wait_served
record "watchdog: frozen daemon replaced and serving after $(since "$t0") s (WatchdogSec=3 in the test)"
check "watchdog replaced the frozen process" test "$(mainpid)" != "$pid"
check "socket still active after the watchdog kill" test "$(systemctl is-active rasd.socket)" = active

# ----------------------------------------------------------------------------- 7. crash loop
say "7. crash loop"
t0=$(now)
for i in 1 2 3 4 5 6 7; do
    p=$(mainpid)
    [ "$p" != 0 ] && kill -9 "$p"
    sleep 0.3
    for _ in $(seq 50); do p2=$(mainpid); [ "$p2" != 0 ] && [ "$p2" != "$p" ] && break; sleep 0.1; done
done
wait_active; wait_served
record "crash loop: 7 kill -9 in $(since "$t0") s incl. recovery; service $(systemctl is-active rasd.service), socket $(systemctl is-active rasd.socket)"
check "no start-limit-hit after 7 quick crashes" test "$(systemctl show -p Result --value rasd.service)" != start-limit-hit
check "service active after the crash loop" wait_active

# ------------------------------------------------------------ 7b. a refused start
say "7b. a refused start does not loop"
cp /etc/default/rasd /etc/default/rasd.good
echo "RASD_CONFIRM_INTERVAL=abc" >>/etc/default/rasd
systemctl restart rasd.service 2>/dev/null
for _ in $(seq 30); do [ "$(systemctl is-active rasd.service)" = failed ] && break; sleep 0.2; done
n1=$(systemctl show -p NRestarts --value rasd.service)
sleep 1.5  # seven RestartSec periods: a looping unit would have restarted meanwhile
n2=$(systemctl show -p NRestarts --value rasd.service)
res=$(systemctl show -p Result --value rasd.service)
record "refused start: $(systemctl is-active rasd.service), Result=$res, restarts $n1 then $n2"
check "a refused start (exit 2) fails the unit instead of restarting" \
    test "$(systemctl is-active rasd.service)" = failed -a "$n1" = "$n2" -a "$res" = exit-code
n=$(journalctl -u rasd.service -o cat | grep -c "confirm_interval (from RASD_CONFIRM_INTERVAL)" || true)
check "the journal names the refused setting ($n lines)" test "$n" -ge 1
mv /etc/default/rasd.good /etc/default/rasd
systemctl reset-failed rasd.service
systemctl start rasd.service
check "starts again once the setting is fixed" wait_active
wait_served

# ------------------------------------------------------- 7c. a refused AWS setting
say "7c. an AWS setting rasd cannot honour refuses the start, cached settings or not"
cp /etc/default/rasd /etc/default/rasd.good
echo "HTTP_PROXY=socks5h://127.0.0.1:1080" >>/etc/default/rasd
systemctl restart rasd.service 2>/dev/null
for _ in $(seq 50); do [ "$(systemctl is-active rasd.service)" = failed ] && break; sleep 0.2; done
check "a SOCKS proxy fails the unit (exit 2)" \
    test "$(systemctl is-active rasd.service)" = failed -a "$(systemctl show -p Result --value rasd.service)" = exit-code
n=$(journalctl -u rasd.service -o cat | grep startup_refused | grep -c SOCKS || true)
check "the journal names the SOCKS proxy ($n lines)" test "$n" -ge 1
mv /etc/default/rasd.good /etc/default/rasd
systemctl reset-failed rasd.service
systemctl start rasd.service
check "starts again once the setting is fixed" wait_active
wait_served

# ------------------------------------------------- 8. DynamoDB unreachable at start
say "8. DynamoDB unreachable at start"
systemctl stop moto-$MOTO_RUNS.service
systemctl restart rasd.service
sleep 3
st=$(systemctl show -p StatusText --value rasd.service)
record "degraded status: $st"
check "service stays active while DynamoDB is down" test "$(systemctl is-active rasd.service)" = active
check "STATUS= says degraded and names the endpoint" bash -c "[[ \"$st\" == degraded* && \"$st\" == *$ENDPOINT* ]]"
out=$(load --calls 20 --threads 2)
record "calls while degraded: $out"
check "calls while degraded fail fast with UNAVAILABLE" bash -c "echo '$out' | grep -q UNAVAILABLE"
t0=$(now)
check "moto back on the same port" start_moto
seed  # moto keeps nothing across a restart
wait_served
record "DynamoDB back: serving again after $(since "$t0") s (retry backoff 0.5..2 s in the test)"
check "recovers once DynamoDB is back" wait_served
n=$(journalctl -u rasd.service -o cat | grep -c Traceback || true)
check "no traceback in the journal ($n)" test "$n" = 0
n=$(journalctl -u rasd.service -o cat | grep -c "Unclosed client session" || true)
check "no 'Unclosed client session' in the journal ($n)" test "$n" = 0

# ---------------------------------------------------------------------- 9. log priorities
say "9. log priorities"
journalctl --sync 2>/dev/null || true
pr=$(journalctl -u rasd.service -p warning -o json --output-fields=PRIORITY,MESSAGE | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(len(rows), sorted({r["PRIORITY"] for r in rows}), sum("startup_failed" in r.get("MESSAGE", "") for r in rows))')
record "journalctl -u rasd -p warning: lines, priorities, startup_failed lines = $pr"
check "-p warning shows the start-up failures" bash -c "[ \"\$(echo '$pr' | awk '{print \$NF}')\" -gt 0 ]"
n=$(journalctl -u rasd.service -p warning -o cat | grep -c '"level": "info"' || true)
check "-p warning shows no info lines ($n)" test "$n" = 0
n=$(journalctl -u rasd.service -p info -o cat | grep -c '"event": "ready"' || true)
check "info lines are in the journal at info ($n ready lines)" test "$n" -gt 0

# ------------------------------------------------------------- 9b. AWS settings cache
say "9b. the AWS settings cache"
n=$(journalctl -u rasd.service -o cat | grep '"event": "ready"' | grep -c '"origin": "cache"' || true)
check "restarts served on the last start's AWS settings ($n ready lines say origin cache)" test "$n" -gt 0
n=$(journalctl -u rasd.service -o cat | grep -c aws_settings_confirmed || true)
check "botocore confirmed them in the background ($n times)" test "$n" -gt 0
n=$(journalctl -u rasd.service -o cat | grep -c 'aws_settings_unconfirmed\|aws_settings_changed\|aws_settings_child_failed' || true)
check "no check failed, disagreed or fell back in-process ($n lines)" test "$n" = 0
check "/var/cache/rasd is the daemon's own (0700), its entries 0600" bash -c \
    '[ "$(stat -c %U:%a /var/cache/rasd)" = rasd:700 ] && for f in /var/cache/rasd/aws-*.json; do [ "$(stat -c %U:%a "$f")" = rasd:600 ] || exit 1; done'

# ----------------------------------------------------------------------------- 10. stop time
say "10. stop"
t0=$(now)
systemctl stop rasd.service
record "stop: systemctl stop took $(since "$t0") s"
check "socket stays open when the service stops" test "$(systemctl is-active rasd.socket)" = active

# ------------------------------------------------------------------------- 11. exposure
exp=$(systemd-analyze security rasd.service --no-pager 2>/dev/null | tail -1)
record "systemd-analyze security: $exp"
level=$(printf '%s\n' "$exp" | grep -oE '[0-9]+\.[0-9]+' | head -1)
check "exposure $level, at 1.6 or better" awk -v x="$level" 'BEGIN { exit !(x != "" && x <= 1.6) }'

# ------------------------------------------------------------------------ 12. the package
if [ -n "${RASD_DEB_UPGRADE:-}" ]; then
    say "12. package upgrade in place under load"
    systemctl start rasd.service; wait_active; wait_served
    # the load runs until the upgrade is over (and 2 s more), so it spans the restart
    load --calls 2000 --threads 4 --pace 0.01 --started /tmp/l12 --until /tmp/l12.done >"$OUT/upgrade.json" &
    lp=$!
    for _ in $(seq 100); do [ -e /tmp/l12 ] && break; sleep 0.05; done
    sleep 0.3
    pid=$(mainpid)
    ta=$(now)
    apt-get install -y -q "$RASD_DEB_UPGRADE" >>"$OUT/apt.log" 2>&1 || fail "upgrade install"
    record "upgrade: installed $(dpkg-query -W -f '${Version}' rasd); daemon pid $pid -> $(mainpid); apt-get from $ta to $(now) (epoch s)"
    check "upgrade restarted the daemon" test "$(mainpid)" != "$pid"
    sleep 2
    touch /tmp/l12.done
    wait $lp
    out=$(cat "$OUT/upgrade.json")
    record "upgrade under load: $out"
    n=$(echo "$out" | failed_of); nd=$(echo "$out" | dynamodb_of)
    check "upgrade under load: no call failed but for DynamoDB ($((n - nd)) of $n failed otherwise)" test "$((n - nd))" = 0
    [ "$n" = 0 ] && record "ok: upgrade under load failed no call at all" \
        || miss "upgrade under load: $nd calls failed because DynamoDB (moto on this machine) was slow or failing"
    check "upgrade handed over in place (postinst log)" grep -q "handed over from pid" "$OUT/apt.log"
    check "socket stayed the same inode across the upgrade" test "$(stat -c %i /run/rasd/rasd.sock)" = "$INODE"
    check "the upgraded daemon serves" wait_served
    say "13. purge"
    apt-get purge -y -q rasd >>"$OUT/apt.log" 2>&1 || fail "purge"
    check "purge removes the venv, commands, units, sysusers file, config, docs" bash -c "for f in /opt/venvs/rasd /usr/bin/rasd /usr/bin/rasadmin /lib/systemd/system/rasd.service /lib/systemd/system/rasd.socket /usr/lib/sysusers.d/rasd.conf /etc/rasd /etc/default/rasd /usr/share/doc/rasd /run/rasd /var/cache/rasd; do [ ! -e \$f ] || { echo left: \$f; exit 1; }; done"
    check "purge leaves no enable symlink" bash -c "! ls /etc/systemd/system/*.wants/rasd.* 2>/dev/null | grep -q ."
    check "nothing left running after purge" bash -c "! systemctl is-active -q rasd.socket && ! systemctl is-active -q rasd.service && ! pgrep -u rasd >/dev/null"
    check "systemd no longer knows the units" bash -c "[ \"\$(systemctl show -p LoadState --value rasd.service)\" = not-found ]"
    check "the rasd user and groups stay (Debian policy: files may still be theirs)" bash -c "getent passwd rasd && getent group rasd-clients" >/dev/null
    check "dpkg knows nothing of rasd" bash -c "! dpkg -s rasd >/dev/null 2>&1"
fi

record "MISS lines: $(grep -c '^MISS' "$RES") (timing-dependent promises not met on this machine; load average $(cut -d' ' -f1-3 /proc/loadavg))"
record "---"
record "systemd test: $FAILS failed checks"
[ "$FAILS" = 0 ]

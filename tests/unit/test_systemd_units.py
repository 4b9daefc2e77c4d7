"""The shipped systemd units, sysusers file and example config keep their key settings.

These files are read by systemd and operators, not by Python, so nothing else would notice a
careless edit (a dropped Type=notify, a RuntimeDirectory= that chowns the socket away from
its clients' group). Each assertion names the behaviour it protects.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import uvloop

from rasd.config import Config, load
from rasd.server import LISTEN_BACKLOG, Daemon
from rasd.server.peercred import Acl

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"

Unit = dict[str, dict[str, list[str]]]


def parse_unit(path: Path) -> Unit:
    """A systemd unit file: section -> key -> every value assigned, in order (systemd keys
    may repeat, e.g. SystemCallFilter=, and an empty assignment resets a list)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"{path.name}:{n}: setting outside a section"
        assert "=" in line, f"{path.name}:{n}: not key=value: {line!r}"
        assert not line.endswith("\\"), f"{path.name}:{n}: keep settings on one line"
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values, f"[{section}] {key}= is missing"
    assert len(values) == 1, f"[{section}] {key}= is set {len(values)} times"
    return values[0]


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min)?", value)
    assert m, f"unexpected time span {value!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "min": 60, None: 1}[m.group(2)]


@pytest.fixture(scope="module")
def socket_unit() -> Unit:
    return parse_unit(SYSTEMD / "rasd.socket")


@pytest.fixture(scope="module")
def service() -> Unit:
    return parse_unit(SYSTEMD / "rasd.service")


# ------------------------------------------------------------------------------- socket
def test_socket_listens_where_clients_look(socket_unit: Unit) -> None:
    """The client library's default path (docs/protocol.md) is the path systemd binds."""
    assert one(socket_unit, "Socket", "ListenStream") == "/run/rasd/rasd.sock"
    assert one(socket_unit, "Install", "WantedBy") == "sockets.target"


def test_socket_is_only_for_the_clients_group(socket_unit: Unit) -> None:
    """0660 + SocketGroup=rasd-clients: only that group (and root) may connect."""
    assert one(socket_unit, "Socket", "SocketMode") == "0660"
    assert one(socket_unit, "Socket", "SocketGroup") == "rasd-clients"


def test_socket_is_one_listener_for_one_daemon(socket_unit: Unit) -> None:
    """Accept=no: the daemon gets the listening socket (not one instance per connection);
    the socket file stays when the unit stops, so clients never see it vanish."""
    assert one(socket_unit, "Socket", "Accept") == "no"
    assert one(socket_unit, "Socket", "RemoveOnStop") == "no"


def test_socket_survives_service_restarts(socket_unit: Unit) -> None:
    """No PartOf=/BindsTo= on the service: restarting (or upgrading) rasd.service must not
    close the listening socket and drop the callers queued in its backlog."""
    for key in ("PartOf", "BindsTo"):
        assert key not in socket_unit["Unit"], f"{key}= would bounce the socket on restart"


def test_socket_backlog_is_the_daemons(socket_unit: Unit) -> None:
    """rasd.socket's Backlog= and the backlog ``rasd serve --socket`` listens with are one
    figure, so a connect storm (every worker of a web server at once) meets the same queue
    with or without socket activation."""
    assert int(one(socket_unit, "Socket", "Backlog")) == LISTEN_BACKLOG


def refused_connects(path: str, n: int) -> int:
    """Connect ``n`` times without accepting any; how many the kernel refused (EAGAIN)."""
    refused = 0
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            refused += 1
        else:
            socks.append(s)
    for s in socks:
        s.close()
    return refused


@pytest.mark.parametrize("inherited", [False, True], ids=["bound", "inherited"])
def test_daemon_listens_with_the_socket_units_backlog(tmp_path: Path, inherited: bool) -> None:
    """The daemon's listening socket queues 600 connects nobody has accepted yet, both the
    one it binds itself and one it inherits: asyncio and uvloop call listen() again on a
    socket they are given, which must not cut systemd's Backlog= down to their default."""
    if int(Path("/proc/sys/net/core/somaxconn").read_text()) < 600:
        pytest.skip("net.core.somaxconn caps every backlog below 600 on this machine")
    path = str(tmp_path / "d.sock")
    sock = None
    if inherited:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(LISTEN_BACKLOG)  # as systemd does with Backlog=

    async def main() -> int:
        d = Daemon(Config(socket=path).validate())
        await d.listen(sock)
        assert d.server is not None
        try:
            return refused_connects(path, 600)  # the loop never runs: nothing is accepted
        finally:
            d.server.close()

    try:
        assert uvloop.run(main()) == 0
    finally:
        if sock is not None:
            sock.close()


def test_service_never_gives_up(service: Unit) -> None:
    """A crash loop is retried forever (no start-limit-hit that fails both units for good),
    and log priorities reach the journal."""
    assert one(service, "Unit", "StartLimitIntervalSec") == "0"
    assert one(service, "Service", "SyslogLevelPrefix") == "yes"


# ------------------------------------------------------------------------------ service
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("Restart", "always"),
        ("KillSignal", "SIGTERM"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("User", "rasd"),
        ("CacheDirectory", "rasd"),
        ("CacheDirectoryMode", "0700"),
    ],
)
def test_service_key_settings(service: Unit, key: str, value: str) -> None:
    """Readiness by sd_notify from the main pid only, restart on any exit, SIGHUP reload,
    SIGTERM drain, the hardening baseline, and a private cache directory (the AWS settings
    of the last start: rasd.dynamo.awscache)."""
    assert one(service, "Service", key) == value


def test_service_runs_the_daemon_with_the_config(service: Unit) -> None:
    """ExecStart is `rasd serve --config /etc/rasd/rasd.toml` (docs/operations.md's command)."""
    argv = shlex.split(one(service, "Service", "ExecStart"))
    assert argv == ["/usr/bin/rasd", "serve", "--config", "/etc/rasd/rasd.toml"]


def test_service_is_socket_activated(service: Unit) -> None:
    """The service requires and follows its socket unit, and enabling it enables both."""
    assert "rasd.socket" in one(service, "Unit", "Requires").split()
    assert "rasd.socket" in one(service, "Unit", "After").split()
    assert one(service, "Install", "Also") == "rasd.socket"


def test_service_watchdog_and_stop_timeouts_are_sane(service: Unit) -> None:
    """WatchdogSec=10 (the daemon pings every 5 s); TimeoutStopSec leaves room for the
    daemon's two 5 s drains (requests, then background writes) before SIGKILL; start-up has
    more than its 30 s warm-up deadline."""
    assert seconds(one(service, "Service", "WatchdogSec")) == 10
    assert seconds(one(service, "Service", "TimeoutStopSec")) > 10
    assert seconds(one(service, "Service", "TimeoutStartSec")) > 30


def test_service_syscall_filter_and_memory_bound(service: Unit) -> None:
    """The syscall allow-list starts from @system-service; memory is bounded so a leak
    ends in a restart, not in the host's OOM killer picking an app."""
    filters = service["Service"]["SystemCallFilter"]
    assert filters[0] == "@system-service"
    assert all(f.startswith("~") for f in filters[1:])
    assert one(service, "Service", "MemoryMax").endswith(("M", "G"))


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("RuntimeDirectory", "would chown /run/rasd and the socket to rasd:rasd (or delete it)"),
        ("DynamicUser", "the daemon runs as the static rasd user"),
        ("PrivateUsers", "SO_PEERCRED would report every caller as nobody"),
        ("ProtectProc", "the /proc fallback for callers' groups needs /proc/<pid>/status"),
        ("IPAddressDeny", "DynamoDB's addresses are AWS's, and the role's credentials IMDS'"),
    ],
)
def test_service_does_not_set(service: Unit, key: str, why: str) -> None:
    """Settings that look like hardening but break socket ownership or caller identity."""
    assert key not in service["Service"], f"{key}= must not be set: {why}"


# ----------------------------------------------------------------------------- sysusers
def test_sysusers_creates_the_users_the_units_name(socket_unit: Unit, service: Unit) -> None:
    """The user the service runs as and the socket's group exist after systemd-sysusers."""
    entries = [
        line.split()
        for line in (SYSTEMD / "rasd.sysusers.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    users = {e[1] for e in entries if e[0] == "u"}
    groups = {e[1] for e in entries if e[0] in ("g", "u")}
    assert one(service, "Service", "User") in users
    assert one(service, "Service", "Group") in groups
    assert one(socket_unit, "Socket", "SocketGroup") in groups


# ------------------------------------------------------------------------- example config
SETTING = re.compile(r"^#(\[?[a-z_][a-z0-9_.\-]*\]?)(\s*=|$)")


def uncommented_example() -> str:
    """The example with every `#setting = value` (and `#[acl]`) line uncommented."""
    lines = (SYSTEMD / "rasd.toml.example").read_text().splitlines()
    return "\n".join(line[1:] if SETTING.match(line) else line for line in lines) + "\n"


def test_example_config_loads_with_everything_uncommented(tmp_path: Path) -> None:
    """Every setting shown in the example is a real setting with a valid value, and the
    [acl] examples have the shape the Acl accepts."""
    path = tmp_path / "rasd.toml"
    path.write_text(uncommented_example())
    cfg = load(str(path), env={})
    assert cfg.acl
    acl = Acl.from_config(cfg.acl, uid_of=lambda name: 33, gid_of=lambda name: 2100)
    assert acl.grant(33, []).allows("ads")
    assert acl.grant(1, [2100]).allows("reports")
    assert acl.grant(1001, []).allows("demo")


def test_example_config_documents_every_setting_with_its_default(tmp_path: Path) -> None:
    """The example shows each Config field, at its default value (except the two shown as
    examples because they have no default): the file and the code cannot drift apart."""
    text = uncommented_example().split("[acl]")[0]
    path = tmp_path / "rasd.toml"
    path.write_text(text)
    cfg = load(str(path), env={})
    defaults = Config()
    examples = {"endpoint_url", "metrics_port"}
    for f in dataclasses.fields(Config):
        if f.name == "acl":
            continue
        assert re.search(rf"^{f.name} =", text, re.M), f"{f.name} is not in rasd.toml.example"
        if f.name not in examples:
            assert getattr(cfg, f.name) == getattr(defaults, f.name), (
                f"{f.name}: the example shows {getattr(cfg, f.name)!r}, "
                f"the default is {getattr(defaults, f.name)!r}"
            )


# ------------------------------------------------------------- the metadata service's rule
def test_the_metadata_services_firewall_rule_refuses_every_other_user() -> None:
    """The rule the package ships (/usr/share/rasd/rasd-imds.nft): both of the instance
    metadata service's addresses, refused to every uid but root and rasd."""
    text = (SYSTEMD / "rasd-imds.nft").read_text()
    for family, addr in (("ip", "169.254.169.254"), ("ip6", "fd00:ec2::254")):
        rule = f'{family} daddr {addr} meta skuid != {{ 0, "rasd" }} counter reject'
        assert rule in text, rule
    assert "policy accept" in text  # it refuses those packets, nothing else


@pytest.mark.skipif(
    shutil.which("nft") is None or os.geteuid() != 0, reason="needs nft (nftables) and root"
)
def test_nft_accepts_the_metadata_services_firewall_rule(tmp_path: Path) -> None:
    """Checked by nft, not loaded (rasd's user as nobody: nft resolves names, and this host
    may have no rasd user)."""
    rule = tmp_path / "rasd-imds.nft"
    rule.write_text((SYSTEMD / "rasd-imds.nft").read_text().replace('"rasd"', '"nobody"'))
    out = subprocess.run(["nft", "-c", "-f", str(rule)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr

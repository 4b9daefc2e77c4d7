"""The contract in docs/ matches the code: error codes (docs/errors.md) and the wire limits
(docs/protocol.md). Both pages are parsed as markdown tables, so adding a code or a limit to one
side and not the other fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import rasd_client
from rasd.core import errors as rasd_errors
from rasd_client import errors, wire

DOCS = Path(__file__).resolve().parents[2] / "docs"


def tables(path: Path) -> list[list[dict[str, str]]]:
    """Every markdown table of ``path``: a list of rows, each a dict header -> cell."""
    out: list[list[dict[str, str]]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        is_table = (
            lines[i].startswith("|")
            and i + 1 < len(lines)
            and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()) is not None
        )
        if not is_table:
            i += 1
            continue
        header = cells(lines[i])
        rows: list[dict[str, str]] = []
        i += 2
        while i < len(lines) and lines[i].startswith("|"):
            rows.append(dict(zip(header, cells(lines[i]), strict=True)))
            i += 1
        out.append(rows)
    return out


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_with(path: Path, *columns: str) -> list[dict[str, str]]:
    found = [t for t in tables(path) if t and all(c in t[0] for c in columns)]
    assert len(found) == 1, f"{path.name}: expected one table with columns {columns}"
    return found[0]


def code_span(cell: str) -> str:
    m = re.fullmatch(r"`([^`]+)`", cell)
    assert m, f"expected one `code span`, got {cell!r}"
    return m.group(1)


def resolve(dotted: str) -> Any:
    """The value a dotted name stands for: a module's constant, or a class attribute (a
    Config setting's default)."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"cannot resolve {dotted}")


# ------------------------------------------------------------------------------- errors
def documented_errors() -> dict[str, dict[str, str]]:
    rows = table_with(DOCS / "errors.md", "code", "client raises", "retryable", "when")
    out = {code_span(r["code"]): r for r in rows}
    assert len(out) == len(rows), "a code is documented twice"
    return out


def test_every_error_code_is_documented_and_every_documented_code_exists() -> None:
    assert set(documented_errors()) == set(errors.ERRORS_BY_CODE)


def test_documented_client_exception_is_the_class_of_the_code() -> None:
    for code, row in documented_errors().items():
        raised = resolve(code_span(row["client raises"]))
        assert raised is errors.ERRORS_BY_CODE[code], code
        assert raised.code == code
        assert getattr(rasd_client, raised.__name__) is raised  # the public name works


def test_every_code_says_whether_to_retry_and_when() -> None:
    for code, row in documented_errors().items():
        assert re.match(r"(yes|no)\b", row["retryable"]), (code, row["retryable"])
        assert len(row["when"]) > 20, code


def test_daemon_and_client_share_one_set_of_codes() -> None:
    assert rasd_errors.ERRORS_BY_CODE is errors.ERRORS_BY_CODE


def test_protocol_page_lists_the_same_codes() -> None:
    code_rows = [
        r
        for t in tables(DOCS / "protocol.md")
        for r in t
        if r.get("field") == "`code`" and "meaning" in r
    ]
    assert len(code_rows) == 1, "protocol.md: one table row documents the `code` field"
    code_row = code_rows[0]
    listed = set(re.findall(r"`([A-Z_]+)`", code_row["meaning"]))
    assert listed == set(errors.ERRORS_BY_CODE)


# ------------------------------------------------------------------------------- limits
#: Constants that are part of the wire contract: each must have a row in the limits table.
CONTRACT_CONSTANTS = {
    "rasd_client.wire.VERSION",
    "rasd_client.wire.HEADER_SIZE",
    "rasd_client.wire.MAX_FRAME",
    "rasd.config.Config.max_pending_per_conn",
    "rasd.config.Config.max_connections_per_process",
    "rasd.config.Config.max_connections_per_uid",
    "rasd.config.Config.frame_timeout",
    "rasd.config.Config.idle_timeout",
    "rasd.wire.MAX_DEADLINE_MS",
    "rasd.wire.MAX_ID_LEN",
    "rasd.core.lease.MAX_KEY_LEN",
}


def documented_limits() -> dict[str, int]:
    rows = table_with(DOCS / "protocol.md", "limit", "value", "in the code")
    out = {code_span(r["in the code"]): int(r["value"].replace(",", "")) for r in rows}
    assert len(out) == len(rows), "a constant is documented twice"
    return out


def test_every_wire_limit_is_documented_with_its_value() -> None:
    limits = documented_limits()
    assert set(limits) == CONTRACT_CONSTANTS
    for dotted, value in limits.items():
        assert resolve(dotted) == value, dotted


def test_every_upper_case_constant_of_the_wire_module_is_in_the_contract() -> None:
    """A new constant in rasd_client.wire is part of the wire format: document it."""
    public = {f"rasd_client.wire.{n}" for n in vars(wire) if re.fullmatch(r"[A-Z][A-Z_]*", n)}
    assert public <= CONTRACT_CONSTANTS


def test_the_prose_states_the_same_frame_limit() -> None:
    text = (DOCS / "protocol.md").read_text(encoding="utf-8")
    assert f"at most **{wire.MAX_FRAME}**" in text


def test_documented_limits_are_enforced() -> None:
    """The documented values are the ones parse() and the decoder apply."""
    import pytest

    from rasd import wire as daemon_wire
    from rasd.core.errors import BadRequest

    good = {
        "v": 1,
        "id": 1,
        "op": "get_lease",
        "client_id": "c" * daemon_wire.MAX_ID_LEN,
        "pool_id": "p",
        "key": "k",
        "lease_expires_us": 1,
        "deadline_ms": daemon_wire.MAX_DEADLINE_MS,
    }
    daemon_wire.parse(good)
    for field, value in [
        ("client_id", "c" * (daemon_wire.MAX_ID_LEN + 1)),
        ("pool_id", "p" * (daemon_wire.MAX_ID_LEN + 1)),
        ("deadline_ms", daemon_wire.MAX_DEADLINE_MS + 1),
    ]:
        with pytest.raises(BadRequest):
            daemon_wire.parse({**good, field: value})
    dec = wire.FrameDecoder()
    dec.feed(wire.encode({"v": 1, "id": 1, "pad": "x" * (wire.MAX_FRAME - 100)}))
    assert len(list(dec.frames())) == 1

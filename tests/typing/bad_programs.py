"""Programs mypy must reject, kept in mypy's ``files`` (pyproject) with
``warn_unused_ignores``: each line that breaks a program's type is marked with the
``type: ignore`` of the error mypy reports there, so the day mypy stops rejecting it the
ignore is unused and mypy fails. The ``assert_type`` lines pin what a program is sent back.

Nothing runs these: mypy reads them (``make typecheck``)."""

from __future__ import annotations

from typing import assert_type

from rasd.core.lease import Lease, Mapping, ResourceItem
from rasd.core.writes import ItemKey, Value
from rasd.steps import (
    At,
    GetItem,
    Now,
    Program,
    QueryLeased,
    QueryMappings,
    WriteResult,
    goto,
    together,
)
from rasd.steps.daemon import CachePut, DaemonProgram, NewToken


# ------------------------------------------------------------- what a program may yield
def yields_a_foreign_value(ident: ItemKey) -> Program[None]:
    yield ("GetItem", ident)  # type: ignore[misc]


def a_job_yields_a_daemon_effect() -> Program[None]:
    yield NewToken()  # type: ignore[misc]


def a_job_delegates_to_a_daemon_program(lease: Lease) -> Program[str | None]:
    return (yield from a_daemon_program(lease))  # type: ignore[misc]


def a_job_ends_as_a_daemon_program(lease: Lease) -> Program[str | None]:
    return (yield from goto(a_daemon_program, lease))  # type: ignore[misc]


def a_local_effect_in_another_region() -> Program[int]:
    return (yield from At("eu-west-1", Now()))  # type: ignore[arg-type]


def a_daemon_program(lease: Lease) -> DaemonProgram[str | None]:
    token = yield from NewToken()
    assert_type(token, str)
    yield token  # type: ignore[misc]
    yield CachePut(lease, 0.0)
    return token


# ------------------------------------------------------------ what a program is sent
def uses_a_result_as_the_wrong_type(ident: ItemKey) -> Program[int]:
    item = yield from GetItem(ident)
    assert_type(item, dict[str, Value] | None)
    return item  # type: ignore[return-value]


def uses_a_result_it_did_not_type() -> Program[int]:
    now = yield Now()
    return now + 1  # type: ignore[operator]


def uses_a_result_in_another_region(ident: ItemKey) -> Program[str]:
    got = yield from At("eu-west-1", GetItem(ident))
    return got["owner"]  # type: ignore[index, return-value]


def mixes_up_results_sent_together(c: str, p: str, k: str) -> Program[list[Mapping]]:
    ms, held = yield from together(QueryMappings(c, p, k), QueryLeased(c, p, k))
    assert_type(ms, list[Mapping])
    assert_type(held, list[ResourceItem])
    return held  # type: ignore[return-value]


def takes_a_read_for_a_write(ident: ItemKey) -> Program[str]:
    res: WriteResult = yield from GetItem(ident)  # type: ignore[assignment]
    return res.outcome.value

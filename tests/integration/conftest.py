"""Daemons started in the test's event loop, on a socket in tmp_path, against moto over HTTP."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from rasd.config import Config
from rasd.core.clock import Clock
from rasd.server import Daemon

_ids = itertools.count()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory (AF_UNIX paths are limited to 107 bytes), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="rasd-t-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_daemon(moto_endpoint: str, table: str, short_tmp: Path) -> Callable[..., Any]:
    """``async with make_daemon(region=..., clock=...) as d:`` runs a Daemon in this loop."""

    @asynccontextmanager
    async def factory(clock: Clock | None = None, **overrides: Any) -> AsyncIterator[Daemon]:
        # This machine's kernel keeps no synchronised clock: the Date header alone (moto's
        # on loopback: the same clock); a test's own clock is far from moto's: no check.
        overrides.setdefault("clock_check", "date" if clock is None else "off")
        overrides.setdefault("endpoint_url", moto_endpoint)
        cfg = Config(
            table=table,
            socket=str(short_tmp / f"d{next(_ids)}.sock"),
            ddb_warm_connections=1,
            **overrides,
        ).validate()
        d = Daemon(cfg, clock=clock)
        await d.startup()
        try:
            yield d
        finally:
            await d.shutdown(drain=2.0)

    return factory


@pytest.fixture
def socket_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients of this test (this process's, and those it starts) ask over the socket
    only, never a hit table: for the tests that count the socket path's connections."""
    from rasd_client import _table

    monkeypatch.setenv("RASD_CLIENT_TABLE", "0")
    monkeypatch.setattr(_table.current, "enabled", False)

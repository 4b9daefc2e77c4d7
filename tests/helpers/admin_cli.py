"""rasadmin as its tests drive it: every command its parser has, each with the least argv it
accepts, run in-process with its exit status and output."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from rasd_jobs.admin import cli

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
#: the heading of docs/operations.md's table of every rasadmin command's exit status
EXIT_TABLE = "### rasadmin's exit status"


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every rasadmin command by name, with its parser (so a new command is never missed)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def least_argv(name: str, parser: argparse.ArgumentParser) -> list[str]:
    """``name`` with a value for each required flag and required group: ``1`` where a flag
    converts its value (a count), ``x`` (a valid name) where it takes text."""
    argv = [name]
    required = [a for a in parser._actions if a.required and a.option_strings]
    for group in parser._mutually_exclusive_groups:
        if group.required:
            required.append(group._group_actions[0])
    for action in required:
        argv += [action.option_strings[0], "1" if action.type is not None else "x"]
    return argv


def takes(parser: argparse.ArgumentParser, flag: str) -> bool:
    return any(flag in a.option_strings for a in parser._actions)


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """rasadmin's exit status (argparse's own exits too), stdout and stderr."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def exit_table() -> dict[str, list[str]]:
    """docs/operations.md's exit status table: command -> its cells (0, 1, 2)."""
    text = OPERATIONS.read_text()
    start = text.index(EXIT_TABLE)
    end = text.find("\n#", start + len(EXIT_TABLE))
    rows: dict[str, list[str]] = {}
    for line in text[start : end if end >= 0 else None].splitlines():
        m = re.match(r"\| `([a-z-]+)` \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


#: Each command's own usage errors (the table's third column) that stop it before it asks
#: DynamoDB anything: (argv, what stderr says). The RAS region is left unset, AWS_REGION set.
USAGE_BEFORE_DYNAMODB: list[tuple[list[str], str]] = [
    (["add-pool", "--client", "c", "--pool", "p", "--max-lease", "0"], "bad --max-lease 0"),
    (["add-pool", "--client", "c", "--pool", "p", "--home", "EU"], "bad --home 'EU'"),
    (
        ["add-pool", "--client", "c", "--pool", "p", "--outage-budget", "600"],
        "refusing --outage-budget 600 without its quarantine: pass --quarantine 627 or more",
    ),
    (
        [
            "add-pool",
            "--client",
            "c",
            "--pool",
            "p",
            "--outage-budget",
            "600",
            "--quarantine",
            "626",
        ],
        "refusing --outage-budget 600 without its quarantine: pass --quarantine 627 or more",
    ),
    (["add-pool", "--client", "c", "--pool", "p", "--quarantine", "60"], "--quarantine goes with"),
    (
        ["add-pool", "--client", "c", "--pool", "p", "--outage-budget", "20", "--quarantine", "60"],
        "no longer than confirm_interval",
    ),
    (["add-resources", "--client", "c", "--pool", "p", "--count", "1"], "no region"),
    (["release-resource", "--client", "c", "--resource", "r"], "no region"),
    (["delete-resource", "--client", "c", "--resource", "r"], "no region"),
    (["adopt"], "no region"),
    (["adopt", "--region", "us-east-1", "--resume-from", "{"], "--resume-from: not JSON"),
    (["adopt", "--region", "us-east-1", "--resume-from", "[1]"], "expected a JSON object"),
]
#: a --prefix longer than any resource name may be
LONG = "x" * 1100
#: Those found once the pool is read (pool demo/default exists, region us-east-1).
USAGE_AFTER_READING: list[tuple[list[str], str]] = [
    (
        ["add-resources", "--client", "demo", "--pool", "default", "--file", "/nonexistent"],
        "cannot read --file /nonexistent",
    ),
    (
        [
            "add-resources",
            "--client",
            "demo",
            "--pool",
            "default",
            "--count",
            "1",
            "--prefix",
            LONG,
        ],
        "bad resource",
    ),
    (
        ["delete-pool", "--client", "demo", "--pool", "default", "--peer-endpoint", "eu-west-1"],
        "bad --peer-endpoint 'eu-west-1'",
    ),
]

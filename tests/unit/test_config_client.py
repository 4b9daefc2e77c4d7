"""Config loading and the client's argument conversion (pure parts)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import rasd_client
from rasd.config import ConfigError, load
from rasd_client._common import expires_us
from rasd_client.errors import error_from_wire


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    """Defaults < TOML file < RASD_* environment < flags."""
    f = tmp_path / "rasd.toml"
    f.write_text('table = "from-file"\nregion = "eu-west-1"\nskew_margin = 2.5\n')
    cfg = load(str(f), env={"RASD_TABLE": "from-env"}, overrides={"region": "ap-south-1"})
    assert (cfg.table, cfg.region, cfg.skew_margin) == ("from-env", "ap-south-1", 2.5)
    assert load(None, env={}).table == "rasd"


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    """A bad value stops start-up with a message naming the setting and where it came from."""
    with pytest.raises(ConfigError, match="RASD_SKEW_MARGIN"):
        load(None, env={"RASD_SKEW_MARGIN": "lots"})
    with pytest.raises(ConfigError, match="extend_fraction"):
        load(None, env={"RASD_EXTEND_FRACTION": "1.5"})
    f = tmp_path / "x.toml"
    f.write_text("tabel = 'typo'\n")
    with pytest.raises(ConfigError, match="unknown setting 'tabel'"):
        load(str(f), env={})


def test_acl_table_is_flattened(tmp_path: Path) -> None:
    """[acl] uid/gid sub-tables become 'uid.N' keys."""
    f = tmp_path / "rasd.toml"
    f.write_text('[acl]\nuid.1001 = ["demo"]\ngid.2000 = ["*"]\n')
    assert load(str(f), env={}).acl == {"uid.1001": ["demo"], "gid.2000": ["*"]}


def test_expires_forms() -> None:
    """lease_expires accepts an aware datetime, a timedelta from now, or epoch seconds."""
    dt = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert expires_us(dt) == int(dt.timestamp()) * 1_000_000
    assert expires_us(timedelta(seconds=10), now=100.0) == 110_000_000
    assert expires_us(1_900_000_000) == 1_900_000_000_000_000
    with pytest.raises(rasd_client.BadRequest):
        expires_us(datetime(2030, 1, 1))  # naive
    with pytest.raises(rasd_client.BadRequest):
        expires_us("tomorrow")  # type: ignore[arg-type]


def test_wire_codes_map_to_classes() -> None:
    """Every code of docs/errors.md maps to its RasdError subclass carrying .code."""
    for code in (
        "BAD_REQUEST",
        "UNKNOWN_POOL",
        "NO_CAPACITY",
        "BUSY",
        "TIMEOUT",
        "UNAVAILABLE",
        "FORBIDDEN",
        "NOT_HELD",
        "INTERNAL",
    ):
        err = error_from_wire(code, "m")
        assert isinstance(err, rasd_client.RasdError) and err.code == code
    assert error_from_wire("BUSY", "m", 0.5).retry_after == 0.5

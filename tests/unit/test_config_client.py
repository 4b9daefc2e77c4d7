"""Config loading and the client's argument conversion (pure parts)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import rasd_client
from rasd.config import CONVERTERS, Config, ConfigError, load
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


def test_every_config_field_has_an_explicit_converter() -> None:
    """A new Config field must say how a string from the environment becomes its type."""
    assert set(CONVERTERS) == {f.name for f in dataclasses.fields(Config)}


def test_env_strings_become_the_fields_types() -> None:
    cfg = load(
        None,
        env={
            "RASD_CACHE_MAX_LEASES": "10",
            "RASD_SKEW_MARGIN": "2",
            "RASD_SOCKET_MODE": "640",
            "RASD_METRICS_PORT": "9100",
            "RASD_ENDPOINT_URL": "http://127.0.0.1:1",
        },
    )
    assert cfg.cache_max_leases == 10 and isinstance(cfg.cache_max_leases, int)
    assert cfg.skew_margin == 2.0 and isinstance(cfg.skew_margin, float)
    assert cfg.socket_mode == 0o640
    assert cfg.metrics_port == 9100
    assert cfg.endpoint_url == "http://127.0.0.1:1"
    empty = load(None, env={"RASD_METRICS_PORT": "", "RASD_ENDPOINT_URL": ""})
    assert empty.metrics_port is None and empty.endpoint_url is None


def test_toml_values_are_converted_too(tmp_path: Path) -> None:
    f = tmp_path / "rasd.toml"
    f.write_text("socket_mode = 0o600\nprefetch_min = 2\nskew_margin = 1\n")
    cfg = load(str(f), env={})
    assert (cfg.socket_mode, cfg.prefetch_min, cfg.skew_margin) == (0o600, 2, 1.0)
    assert isinstance(cfg.skew_margin, float)
    with pytest.raises(ConfigError, match="acl"):
        load(None, env={}, overrides={"acl": ["not", "a", "table"]})
    with pytest.raises(ConfigError, match="RASD_MAX_INFLIGHT"):
        load(None, env={"RASD_MAX_INFLIGHT": "many"})


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

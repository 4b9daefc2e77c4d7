"""`rasd dev`'s settings: every RASD_* setting (and --config) applies as under `rasd serve`,
over rasd dev's own for moto; its socket and endpoint are its own, and it says so; a bad
setting stops it before moto starts. And moto's server process says when it stops."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from rasd import cli
from rasd.config import Config
from rasd.devtools import dev, motoserver


def dev_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["dev", *argv])


def test_rasd_settings_apply_over_devs_own() -> None:
    """dev's settings where nothing is set; RASD_* over them, flags over those."""
    cfg = dev.dev_config(dev_args(), env={})
    assert cfg.metrics_port is None and cfg.log_level == "warning"
    for name, value in dev.DEV_SETTINGS.items():
        assert getattr(cfg, name) == value, name
    env = {
        "RASD_METRICS_PORT": "19465",
        "RASD_MAX_INFLIGHT": "64",
        "RASD_REGION": "eu-west-1",
        "RASD_LOG_LEVEL": "info",
        "RASD_TABLE": "mine",
    }
    cfg = dev.dev_config(dev_args(), env=env)
    assert (cfg.metrics_port, cfg.max_inflight, cfg.region) == (19465, 64, "eu-west-1")
    assert (cfg.log_level, cfg.table) == ("info", "mine")
    assert cfg.prefetch_max == dev.DEV_SETTINGS["prefetch_max"]  # still dev's
    cfg = dev.dev_config(dev_args("--region", "ap-south-1", "--log-level", "debug"), env=env)
    assert (cfg.region, cfg.log_level) == ("ap-south-1", "debug")


def test_a_config_file_applies_too(tmp_path: Path) -> None:
    f = tmp_path / "rasd.toml"
    f.write_text("metrics_port = 19470\nprefetch_min = 8\n")
    cfg = dev.dev_config(dev_args("--config", str(f)), env={"RASD_PREFETCH_MIN": "16"})
    assert (cfg.metrics_port, cfg.prefetch_min) == (19470, 16)


def test_the_socket_and_endpoint_are_devs_and_it_says_so() -> None:
    assert dev.overruled(dev.dev_config(dev_args(), env={})) == []
    cfg = dev.dev_config(
        dev_args(), env={"RASD_SOCKET": "/tmp/x.sock", "RASD_ENDPOINT_URL": "http://h:1"}
    )
    notes = dev.overruled(cfg)
    assert len(notes) == 2
    assert notes[0].startswith("socket '/tmp/x.sock' (RASD_SOCKET or --config) is not used")
    assert "endpoint_url 'http://h:1'" in notes[1] and "its own DynamoDB" in notes[1]
    assert set(dev.DEV_OWNS) <= set(Config.__dataclass_fields__)


def test_a_bad_setting_stops_rasd_dev_before_moto(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the setting and where it came from; no moto, no directory."""

    def no_moto(*_: Any, **__: Any) -> Any:
        raise AssertionError("moto must not start")

    monkeypatch.setattr(motoserver, "spawn", no_moto)
    monkeypatch.setenv("RASD_METRICS_PORT", "lots")
    workdir = tmp_path / "dev"
    assert cli.main(["dev", "--dir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "rasd dev: metrics_port (from RASD_METRICS_PORT): 'lots' is not valid" in err, err
    assert not workdir.exists()


def test_motoservers_help_says_when_it_stops() -> None:
    """`python -m rasd.devtools.motoserver` from a shell with nothing on stdin stops at once:
    its help says so, and how to keep it up."""
    text = " ".join(motoserver.build_parser().format_help().split())
    assert "serves until its stdin closes" in text
    assert "--until-signal serves until Ctrl-C or SIGTERM instead" in text
    assert "--port" in text

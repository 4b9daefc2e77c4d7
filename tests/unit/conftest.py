"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.loaders
import botocore.session
import pytest


@pytest.fixture(scope="session")
def botocore_loader() -> Any:
    return botocore.loaders.create_loader()


@pytest.fixture
def one_botocore_loader(monkeypatch: pytest.MonkeyPatch, botocore_loader: Any) -> Iterator[None]:
    """botocore's data files (the partitions' endpoints and rules, the services' models: JSON,
    most of the 60-80 ms a botocore session takes) read once per process: every session the
    test makes, boto3's, aiobotocore's and rasd's, shares one loader. What a session resolves
    still comes from its own environment and config files (AWS_DATA_PATH, which would change
    the files, is for the test to leave unset)."""
    paths = list(botocore_loader.search_paths)
    monkeypatch.setattr(
        botocore.session, "create_loader", lambda search_path_string=None: botocore_loader
    )
    yield
    botocore_loader.search_paths[:] = paths  # boto3 adds its data path to each session's loader

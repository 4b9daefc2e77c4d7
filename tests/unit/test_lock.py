"""requirements/rasd.lock and build.lock, what the .deb and the Jenkins jobs install: every
dependency of pyproject.toml (the metrics extra included) and its build backend pinned with
their hashes, and both installs use them in pip's hash-checking mode, rasd itself with
nothing more, built by the pinned backend."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "rasd.lock"
BUILD_LOCK = ROOT / "requirements" / "build.lock"


def pinned(lock: Path = LOCK) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of each requirement of the lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", lock.read_text())  # one line per requirement
    for line in text.splitlines():
        if not line or line.lstrip().startswith("#"):
            continue
        spec, _, rest = line.partition(" --hash")
        req = Requirement(spec.split(";")[0].strip())
        (version,) = [s.version for s in req.specifier if s.operator == "=="]
        out[canonicalize_name(req.name)] = (version, re.findall(r"sha256:([0-9a-f]{64})", rest))
    return out


def test_every_dependency_is_pinned_with_its_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["metrics"]]
    lock = pinned()
    for dep in wanted:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in lock, f"{name} is not in {LOCK.name}: make lock"
        version, _ = lock[name]
        assert req.specifier.contains(version), f"{name}=={version} is not {req.specifier}"
    missing = [name for name, (_, hashes) in lock.items() if not hashes]
    assert not missing, f"pinned without hashes (pip refuses in hash-checking mode): {missing}"
    assert "boto3" in lock  # the jobs' client, through aioboto3


def test_the_build_backend_is_pinned_with_its_hashes() -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    lock = pinned(BUILD_LOCK)
    for dep in build:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in lock, f"{name} is not in {BUILD_LOCK.name}: make lock"
        version, hashes = lock[name]
        assert req.specifier.contains(version) and hashes, (name, version)


def test_the_deb_and_the_jobs_install_exactly_the_locks() -> None:
    rules = (ROOT / "debian" / "rules").read_text()
    assert "cat requirements/rasd.lock requirements/build.lock > debian/rasd-all.lock" in rules
    assert "--requirements debian/rasd-all.lock" in rules
    assert "--extra-pip-arg --no-deps" in rules  # rasd itself adds nothing unpinned
    assert "--extra-pip-arg --no-build-isolation" in rules  # built by the pinned backend
    assert "--upgrade-pip" not in rules  # pip is Debian's own, not the index's newest
    jenkins = (ROOT / "jobs" / "Jenkinsfile").read_text()
    assert (
        "pip install --quiet --require-hashes --no-deps -r requirements/rasd.lock"
        " -r requirements/build.lock" in jenkins
    )
    assert "pip install --quiet --no-deps --no-build-isolation ." in jenkins
    assert not re.search(r"pip install --quiet (--upgrade pip|\.$)", jenkins, re.M)

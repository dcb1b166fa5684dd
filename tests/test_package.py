"""Release metadata: one version everywhere, the git commit beside it, license and citation files
that agree with pyproject, the changelog's current section, and `attnflow --version`.
(The wheel itself is built, installed outside the checkout and run by .ci/check_wheel.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
from attnflow import _version

ROOT = Path(__file__).resolve().parents[1]


def test_version_has_one_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "attnflow._version.__version__"
    assert af.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", af.__version__)


def test_cli_prints_version_and_commit():
    out = subprocess.run([sys.executable, "-m", "attnflow", "--version"], capture_output=True,
                         text=True, check=True).stdout.strip()
    # (The commit itself is compared in the next test: HEAD may move between two processes.)
    match = re.fullmatch(rf"attnflow {re.escape(af.__version__)}( \(git [0-9a-f]{{40}}"
                         r"(\+dirty)?\))?", out)
    assert match and bool(match[1]) == (_version.git_commit() is not None), out


def test_commit_is_known_in_a_checkout_and_none_elsewhere(tmp_path, monkeypatch):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    _version.git_commit.cache_clear()  # computed now, beside HEAD (commits may have landed)
    commit = _version.git_commit()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert re.fullmatch(re.escape(head) + r"(\+dirty)?", commit)
    # The same module outside any repository (as in an installed wheel): unknown, not an error.
    copy = tmp_path / "site" / "attnflow" / "_version.py"
    copy.parent.mkdir(parents=True)
    copy.write_text((ROOT / "src" / "attnflow" / "_version.py").read_text())
    monkeypatch.setattr(_version, "__file__", str(copy))
    _version.git_commit.cache_clear()
    try:
        assert _version.git_commit() is None
        assert _version.provenance() == {"version": af.__version__, "commit": None}
    finally:
        _version.git_commit.cache_clear()


def test_trajectory_records_version_and_commit(tmp_path):
    traj = af.simulate(af.Attention(beta=1.0), af.sphere.uniform(5, d=2, seed=0), t_end=1.0,
                       dt=0.5)
    record = traj.record()
    assert record["version"] == af.__version__ and record["commit"] == _version.git_commit()
    traj.commit = "0123abc"
    traj.save(tmp_path / "t.nc")
    back = af.load(tmp_path / "t.nc")
    assert back.commit == "0123abc" and np.array_equal(back.states, traj.states)


def test_license_citation_and_changelog_agree_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"]["text"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = (ROOT / "CITATION.cff").read_text()
    assert re.search(r"^cff-version: 1\.2\.0$", cff, re.M)
    assert re.search(rf"^version: {re.escape(af.__version__)}$", cff, re.M)
    assert re.search(r"^license: MIT$", cff, re.M)
    seed = cff[cff.index("preferred-citation:"):]
    assert "title: Clustering in Causal Attention Masking" in seed
    assert re.findall(r"family-names: (\w+)", seed) == ["Karagodin", "Polyanskiy", "Rigollet"]
    assert "arXiv:2411.04990" in seed
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(af.__version__)}\b", changelog, re.M)


def test_package_ships_its_type_marker_and_data_files():
    assert (Path(af.__file__).parent / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in data["package-data"]["*"]

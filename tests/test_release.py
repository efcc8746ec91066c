"""A release as users get it (issue 27): the sdist and the wheel built by ``python -m build``, both passing
``twine check --strict``, the wheel installed into a fresh venv saying its version, and that version the one
written in ``detectors/__init__.py``, with a CHANGELOG.md section of its own.

This is CI's build step: the suite runs in CI (.ci/run), so every change is built and checked as a release would
be. The build runs without build isolation (``--no-isolation``: the locked setuptools of the test venv, which
satisfies ``[build-system] requires``) so that it needs no package index; a real release builds the same files
with isolation (``python -m build``, README "In CI"). It builds from a copy of the files a release is made of,
so no build/, dist/ or *.egg-info lands in the checkout. The fresh venv borrows the test venv's installed
packages through a path entry and installs the wheel with ``--no-deps``, as tests/test_wheel.py does: this is
about what the wheel holds and says, not about downloading its dependencies again.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RELEASE_FILES = ("pyproject.toml", "README.md", "CHANGELOG.md")
PACKAGE_FOLDERS = ("detectors", "dashboard")


def written_version() -> str:
    """``__version__`` as ``detectors/__init__.py`` writes it (read as setuptools reads it: without importing)."""
    tree = ast.parse((REPO / "detectors" / "__init__.py").read_text(encoding="utf-8"))
    [value] = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
               and any(getattr(t, "id", None) == "__version__" for t in n.targets)]
    return value


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The release's two files: ``{"wheel": ..., "sdist": ...}``."""
    root = tmp_path_factory.mktemp("release")
    src = root / "src"
    src.mkdir()
    for name in RELEASE_FILES:
        shutil.copy2(REPO / name, src / name)
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = (root / "dist").glob("klwatch-*.whl")
    [sdist] = (root / "dist").glob("klwatch-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_twine_check_passes_on_the_wheel_and_the_sdist(dist):
    """What PyPI would refuse (metadata, the README as the long description) is refused here first."""
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(dist["wheel"]), str(dist["sdist"])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r"PASSED", proc.stdout)) == 2, proc.stdout


def test_both_files_carry_the_written_version_and_py_typed(dist):
    version = written_version()
    assert dist["wheel"].name.startswith(f"klwatch-{version}-")
    assert dist["sdist"].name == f"klwatch-{version}.tar.gz"
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert "klwatch/py.typed" in names  # PEP 561: type checkers read the public API's hints
    metadata = zipfile.ZipFile(dist["wheel"]).read(f"klwatch-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata
    with tarfile.open(dist["sdist"]) as sdist:
        assert f"klwatch-{version}/detectors/py.typed" in sdist.getnames()


def test_the_wheel_in_a_fresh_venv_prints_the_version_from_its_metadata(dist, tmp_path):
    folder = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "test-venv-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                                str(dist["wheel"])], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    said = subprocess.run([str(folder / "bin" / "klwatch"), "--version"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert said.returncode == 0, said.stderr
    assert said.stdout == f"klwatch {written_version()}\n"
    where = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.distribution('klwatch').locate_file(''))"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout
    assert where.startswith(site), where  # the wheel's own metadata answered, not the test venv's


def test_the_changelog_opens_with_unreleased_then_this_version():
    """Keep a Changelog: an Unreleased section, then one per release, newest first, each with its date."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert [s[0] for s in sections[:2]] == ["Unreleased", written_version()], sections
    assert all(date for name, date in sections[1:]), sections
    assert "0.1.0" in [s[0] for s in sections]

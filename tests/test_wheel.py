"""The package as users get it from a wheel: ``klwatch`` (the ``detectors/`` folder) and
``klwatch.dashboard`` (the ``dashboard/`` folder) installed into a fresh venv, run from outside the
checkout, so nothing can be imported from the source tree by accident.

The fresh venv borrows the test venv's installed dependencies through a path entry (a ``.pth`` line
does not run that venv's own ``.pth`` files, so its editable klwatch stays out) and installs the wheel
itself with ``--no-deps``: the test is about what the wheel holds, not about downloading its
dependencies again (``scripts/smoke-unlocked.sh`` does that in CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from dashboard_server import running_dashboard

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, the fresh venv's bin folder)."""
    root = tmp_path_factory.mktemp("wheel")
    # built from a copy of what the wheel is made of, so a stale build/ folder in a checkout cannot leak in
    src = root / "src"
    for part in ("pyproject.toml", "README.md"):
        src.mkdir(exist_ok=True)
        shutil.copy2(REPO / part, src / part)
    for folder in ("detectors", "dashboard"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(root / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = (root / "dist").glob("klwatch-*.whl")
    venv.EnvBuilder(with_pip=False).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps-from-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    return wheel, root / "venv" / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"})


def test_the_wheel_holds_the_klwatch_package_and_its_dashboard_and_nothing_named_detectors(wheel_venv):
    wheel, _ = wheel_venv
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("klwatch/__init__.py", "klwatch/cli.py", "klwatch/pipeline.py", "klwatch/sources/tensorboard.py",
                   "klwatch/findings/__init__.py", "klwatch/dashboard/app.py", "klwatch/dashboard/data.py"):
        assert needed in names
    assert not [n for n in names if n.split("/")[0] in ("detectors", "dashboard", "tests", "sample_runs")]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "klwatch = klwatch.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_installed_wheel_scans_the_sample_runs_as_the_checkout_does(wheel_venv, tmp_path):
    _, bin_dir = wheel_venv
    where = _run(bin_dir, bin_dir / "python", "-c", "import klwatch, klwatch.dashboard; print(klwatch.__file__); "
                                                     "print(klwatch.dashboard.__file__)", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert all(str(bin_dir.parent) in line for line in where.stdout.split()), where.stdout
    out = _run(bin_dir, bin_dir / "klwatch", "scan", REPO / "sample_runs", "--format", "json", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    got = json.loads(out.stdout)
    want = json.loads((REPO / "tests" / "golden" / "scan-sample_runs.json").read_text())
    assert got["lineages"] == want["lineages"]  # the same verdicts, byte for byte in every field


def test_the_installed_wheel_runs_the_dashboard_page(wheel_venv, tmp_path):
    """The page itself runs from the wheel (Streamlit's AppTest on the installed app.py), and
    ``klwatch dashboard`` serves it."""
    _, bin_dir = wheel_venv
    script = ("import os, sys\nfrom pathlib import Path\nimport klwatch.dashboard\n"
              "from streamlit.testing.v1 import AppTest\n"
              "os.environ['KLWATCH_DASHBOARD_SOURCES'] = sys.argv[1]\n"
              "at = AppTest.from_file(str(Path(klwatch.dashboard.__file__).parent / 'app.py'), default_timeout=180)\n"
              "at.run()\n"
              "assert not at.exception, [e.message for e in at.exception]\n"
              "print('markdown', len(at.markdown))\n")
    page = _run(bin_dir, bin_dir / "python", "-c", script, REPO / "sample_runs" / "tensorboard", cwd=tmp_path)
    assert page.returncode == 0, page.stderr[-3000:] + page.stdout[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with running_dashboard([str(REPO / "sample_runs")], log=tmp_path / "dashboard.log", timeout=90,
                           klwatch=[str(bin_dir / "klwatch")], cwd=tmp_path, env=env):
        served = _run(bin_dir, bin_dir / "python", "-c", "from klwatch.dashboard_cli import app_path; print(app_path())",
                      cwd=tmp_path)
        assert served.stdout.strip().startswith(str(bin_dir.parent)), served.stdout + served.stderr

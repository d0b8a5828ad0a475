"""The distribution as a user gets it: `python -m build` makes the sdist and, from it, the
wheel; both pass `twine check --strict`; and the wheel installed WITHOUT extras into a
fresh venv runs the README's quick start (`corral demo`, the embedded default store).

Building and installing take a minute or more (Ray is a large wheel), so these tests run
when `CORRAL_WHEEL_TESTS=1`, which `.ci/run` sets for them in a step of their own
(`scripts/check-wheel`); scripts/check's run of the suite skips them, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.environ.get("CORRAL_WHEEL_TESTS") != "1",
    reason="builds and installs the wheel (minutes): .ci/run runs it (scripts/check-wheel)")


def _run(*args: str | Path, cwd: Path, timeout: float = 600) -> str:
    # Nothing of this checkout may leak in: the venv must import the installed wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RAY_AUTH_MODE"] = "disabled"  # as scripts/check: no ~/.ray/auth_token
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("corral-*.whl")
    return wheel


def test_the_sdist_and_the_wheel_pass_twine_check(dist: Path) -> None:
    built = sorted(dist.iterdir())
    assert len(built) == 2, built
    assert len(list(dist.glob("corral-*.tar.gz"))) == 1, built
    assert _wheel(dist).name.endswith("-py3-none-any.whl"), built

    out = _run(sys.executable, "-m", "twine", "check", "--strict", *built, cwd=dist)

    assert out.count("PASSED") == 2, out


def test_the_wheel_holds_the_package_its_type_marker_and_the_command(dist: Path) -> None:
    names = zipfile.ZipFile(_wheel(dist)).namelist()

    assert "corral/__init__.py" in names
    assert "corral/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "src/"))]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "corral = corral.cli:main" in zipfile.ZipFile(_wheel(dist)).read(
        entry_points).decode()


def test_the_wheel_installed_without_extras_runs_the_readme_demo(
    dist: Path, tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _run(venv / "bin" / "pip", "install", "-q", _wheel(dist), cwd=tmp_path)
    where = _run(venv / "bin" / "python", "-c", "import corral; print(corral.__file__)",
                 cwd=tmp_path)
    extras = _run(venv / "bin" / "python", "-c",
                  "import importlib.util as u; print([m for m in "
                  "('asyncpg', 'starlette', 'uvicorn', 'aiosqlite', 'cloudpickle') "
                  "if u.find_spec(m)])", cwd=tmp_path)

    out = _run(venv / "bin" / "corral", "demo", cwd=tmp_path, timeout=180)

    assert where.startswith(str(venv)), where  # the wheel, not this checkout
    assert extras.strip() == "[]"  # no extra came along (cloudpickle: Ray vendors its own)
    assert "5 accepted, 6 duplicate" in out
    assert out.count("<- this call started the run") == 1
    assert "run 1 completed after accepting 6 messages" in out
    assert (tmp_path / "corral-demo.db").exists()

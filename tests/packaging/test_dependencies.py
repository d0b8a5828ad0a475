"""pyproject's dependencies are exactly what `src/corral` imports.

Every distribution that `pip install corral` brings (and every one its runtime extras
`postgres` and `ui` bring) provides a module `src/` imports, and every third-party module
`src/` imports comes from a declared distribution: the core dependencies, or a runtime
extra when `import corral` never needs it (the module importing it is loaded only when
that feature is used). Imports are read from the source with `ast`, lazy ones (inside a
function) included; distributions are mapped to their modules by the installed metadata
(their RECORD).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (tomli comes with pytest there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "corral"

# The extras a user of the library installs for a feature; the others (dev, docs, bench,
# examples) serve the repository's tests, docs, benchmarks and examples, not `src/`.
RUNTIME_EXTRAS = {"otel", "postgres", "ui"}
OTHER_EXTRAS = {"dev", "docs", "bench", "examples"}
# Declared distributions that `src/` does not import, each for a reason.
NOT_IMPORTED = {
    # Starlette parses the dashboard's forms with it (`request.form()`), importing it
    # itself; starlette declares it only as an optional dependency of its own.
    "python-multipart": "starlette's form parser (the dashboard's forms)",
    # The standard library's `zoneinfo` reads the IANA zones of schedules' specs from it
    # where the operating system has none (a slim container); nothing imports it.
    "tzdata": "zoneinfo's time zones where the system has none (schedules)",
}


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _core() -> set[str]:
    deps = _pyproject()["dependencies"]
    assert isinstance(deps, list)
    return _names(deps)


def _extras() -> dict[str, set[str]]:
    extras = _pyproject()["optional-dependencies"]
    assert isinstance(extras, dict)
    return {name: _names(reqs) for name, reqs in extras.items()}


def _imports() -> Iterator[tuple[str, str]]:
    """(top-level module, source file) of each absolute import in src/, lazy ones too."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                yield top, str(path.relative_to(ROOT))


def _third_party() -> dict[str, set[str]]:
    """Each third-party module src/ imports -> the files importing it."""
    found: dict[str, set[str]] = {}
    for top, where in _imports():
        if top not in sys.stdlib_module_names and top != "corral":
            found.setdefault(top, set()).add(where)
    return found


@functools.cache
def _providers() -> dict[str, set[str]]:
    """Each importable top-level module -> the distributions installing it, from their
    RECORD (as `packages_distributions` does from Python 3.11; 3.10's reads only
    `top_level.txt`, which wheels built by hatchling or maturin do not have)."""
    found: dict[str, set[str]] = {}
    for dist in distributions():
        tops = {Path(f.parts[0]).name.removesuffix(".py") for f in dist.files or ()
                if len(f.parts) > 1 or f.suffix == ".py"}
        tops |= set((dist.read_text("top_level.txt") or "").split())
        for top in tops:
            if top.isidentifier():
                found.setdefault(top, set()).add(canonicalize_name(dist.metadata["Name"]))
    return found


def _distributions(module: str) -> set[str]:
    return _providers().get(module, set())


def test_every_extra_is_either_a_runtime_feature_or_for_the_repository() -> None:
    assert set(_extras()) == RUNTIME_EXTRAS | OTHER_EXTRAS, \
        "a new extra: add it to RUNTIME_EXTRAS (src/ uses it) or OTHER_EXTRAS"


def test_every_runtime_dependency_provides_a_module_the_source_imports() -> None:
    imported: set[str] = set()
    for module in _third_party():
        imported |= _distributions(module)
    declared = _core().union(*(_extras()[e] for e in RUNTIME_EXTRAS))
    unused = sorted(declared - imported - set(NOT_IMPORTED))
    assert not unused, f"declared in pyproject.toml but never imported by src/: {unused}"


def test_every_third_party_module_the_source_imports_is_declared() -> None:
    declared = _core().union(*(_extras()[e] for e in RUNTIME_EXTRAS))
    undeclared = {module: sorted(files) for module, files in _third_party().items()
                  if not _distributions(module) & declared}
    assert not undeclared, f"imported by src/ but not a dependency or runtime extra: " \
                           f"{undeclared}"


def test_import_corral_and_its_command_need_no_extra() -> None:
    """With every module only an extra provides made unimportable, `import corral` and
    `corral --help` still work: those modules are imported lazily, by the feature."""
    core = _core()
    extra_only = sorted(module for module in _third_party()
                        if not _distributions(module) & core)
    assert extra_only, "expected the extras' modules (asyncpg, starlette, uvicorn)"
    script = textwrap.dedent(f"""
        import sys

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {extra_only!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Missing())
        import corral, corral.cli, corral.metrics, corral.persistence, corral.testing
        sys.argv = ["corral", "--help"]
        try:
            corral.cli.main()
        except SystemExit as done:
            assert done.code in (0, None), done.code
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "Usage" in run.stdout

"""The public surface is explicit and sorted, and the layers import only downwards."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import types
from collections.abc import Set
from pathlib import Path

import pytest

import corral

PACKAGES = ["corral", "corral.actors", "corral.runtime", "corral.persistence"]
SRC = Path(corral.__file__).parent


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    # isort-style, as ruff's RUF022 keeps it: constants, then classes, then the rest
    kinds = sorted(exported, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    assert exported == kinds, f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported), f"{name}.__all__ lists a name twice"
    assert not [n for n in exported if n.startswith("_")], f"{name}.__all__ leaks private names"
    public = {
        attr for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public - set(exported) == set(), f"{name} has public names missing from __all__"
    assert set(exported) - public == set(), f"{name}.__all__ names what it does not define"


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_imports(name: str) -> None:
    module = importlib.import_module(name)
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    assert set(module.__all__) <= set(namespace)
    for attr in module.__all__:
        assert namespace[attr] is getattr(importlib.import_module(name), attr)


def test_every_user_facing_class_and_function_has_its_own_docstring() -> None:
    for attr in corral.__all__:
        value = getattr(corral, attr)
        if isinstance(value, type | types.FunctionType):
            doc = (value.__doc__ or "").strip()
            # A dataclass without a docstring gets its signature as one.
            assert doc, f"corral.{attr} has no docstring"
            assert not doc.startswith(f"{attr}("), f"corral.{attr} has no docstring"


def test_only_subpackages_and_the_version_are_public_modules_of_corral() -> None:
    modules = {n for n, v in vars(corral).items()
               if isinstance(v, types.ModuleType) and not n.startswith("_")}
    assert modules <= {"actors", "persistence", "runtime", "cli", "testing", "metrics",
                       "dashboard"}
    assert isinstance(corral.__version__, str)


def test_the_top_level_reexports_the_user_facing_objects_themselves() -> None:
    import corral._app
    import corral._common
    import corral._errors
    import corral.actors
    import corral.runtime

    sources = [corral._errors, corral._common, corral.actors, corral.runtime, corral._app]
    for attr in corral.__all__:
        source = next(m for m in sources if attr in m.__all__)
        assert getattr(corral, attr) is getattr(source, attr), attr


def test_the_internals_stay_out_of_the_runtime_surface() -> None:
    import corral.runtime

    assert not {"Activation", "LocalHost", "Router", "Shard"} & set(corral.runtime.__all__)


# -- layering ----------------------------------------------------------------------------

_PROBE = """
import importlib.util, json, sys, types
spec = importlib.util.find_spec("corral")
# A bare parent package: importing corral/__init__.py would pull in every layer.
parent = types.ModuleType("corral")
parent.__path__ = list(spec.submodule_search_locations)
sys.modules["corral"] = parent
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("corral."))))
"""


def loaded_by(package: str) -> set[str]:
    """corral modules that importing `package` loads, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PROBE, package], capture_output=True,
                         text=True, check=True, timeout=60)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("leaf", ["corral._errors", "corral._common", "corral._deadline"])
def test_a_leaf_loads_nothing_else_of_corral(leaf: str) -> None:
    assert loaded_by(leaf) == {leaf}


def test_importing_corral_actors_loads_neither_runtime_nor_persistence() -> None:
    loaded = loaded_by("corral.actors")
    assert "corral.actors" in loaded
    assert not {m for m in loaded if m.startswith(("corral.runtime", "corral.persistence"))}


def test_importing_corral_persistence_loads_neither_the_runtime_nor_the_programming_model(
) -> None:
    loaded = loaded_by("corral.persistence")
    assert "corral.persistence" in loaded
    assert not {m for m in loaded if m.startswith(("corral.runtime", "corral.actors"))}


def imported_corral_modules(path: Path, modules: Set[str] = frozenset()) -> set[str]:
    """Every corral module a source file imports anywhere (including inside functions and
    `TYPE_CHECKING` blocks), resolving relative imports; with `modules` (every corral
    module's name), `from package import name` also counts `package.name` if it is one."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            elif node.module:
                source = node.module
            else:
                continue
            found.add(source)
            found |= {f"{source}.{a.name}" for a in node.names} & modules
    return {m for m in found if m == "corral" or m.startswith("corral.")}


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("actors", ("corral.runtime", "corral.persistence")),
    ("persistence", ("corral.runtime", "corral.actors")),
])
def test_no_source_file_of_a_lower_layer_names_a_higher_one(
    layer: str, forbidden: tuple[str, ...]
) -> None:
    for path in sorted((SRC / layer).glob("*.py")):
        imports = imported_corral_modules(path)
        bad = {m for m in imports if m == "corral" or m.startswith(forbidden)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_fail_run_is_a_public_corral_error_that_user_code_raises() -> None:
    assert "FailRun" in corral.__all__
    assert issubclass(corral.FailRun, corral.CorralError)
    assert corral.Entity.run_retry.max_attempts is None  # suspended runs retry forever


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(under: str = "") -> dict[str, set[str]]:
    """Every corral module (below `under`, e.g. "runtime") and the corral modules it
    imports, `TYPE_CHECKING` and function-level imports included; `from package import
    module` counts as importing the module."""
    paths = sorted((SRC / under).rglob("*.py"))
    names = {module_name(p) for p in sorted(SRC.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path)
        graph[name] = {m for m in imported_corral_modules(path, names) if m != name}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found is not None:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None


def test_no_module_of_corral_imports_itself_back_through_others() -> None:
    graph = import_graph()
    assert {"corral.runtime.host._activation", "corral.actors._state",
            "corral.persistence._postgres", "corral._cli._main"} <= set(graph)
    assert import_cycle(graph) is None, " -> ".join(import_cycle(graph) or [])


def names_module(text: str, module: str) -> bool:
    """Whether `text` names `module` (e.g. "corral.persistence._waits") by its dotted path,
    with or without the leading `corral.`, or by its file (`persistence/_waits.py`, the
    `.py` optional)."""
    dotted = module.removeprefix("corral.")
    forms = (re.escape(dotted), re.escape(dotted.replace(".", "/")) + r"(?:\.py)?")
    return any(re.search(rf"(?<![\w/.]){form}(?![\w/])", text) or
               re.search(rf"(?<![\w/.])corral\.{form}(?![\w/])", text) for form in forms)


def test_names_module_wants_the_whole_path_of_the_module() -> None:
    module = "corral.persistence._waits"
    for text in ("see corral.persistence._waits.", "(`persistence._waits`)",
                 "`persistence/_waits.py`", "in persistence/_waits, the store's"):
        assert names_module(text, module), text
    for text in ("`_waits`", "actors._waits", "persistence._waits_of", "x.persistence._waits",
                 "persistence/_waits/more"):
        assert not names_module(text, module), text


def test_each_module_that_shares_its_basename_names_the_others_in_its_docstring() -> None:
    by_basename: dict[str, list[Path]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.name != "__init__.py":
            by_basename.setdefault(path.name, []).append(path)
    assert len(by_basename) > 100
    unexplained = [
        f"{module_name(path)} does not say why it shares its name with {module_name(other)}"
        for paths in by_basename.values() if len(paths) > 1
        for path in paths
        for other in paths
        if other != path
        and not names_module(ast.get_docstring(ast.parse(path.read_text())) or "",
                             module_name(other))
    ]
    assert not unexplained, "\n".join(unexplained)


ROLES = "corral.runtime.client", "corral.runtime.host", "corral.runtime.ray"


@pytest.mark.parametrize(("role", "forbidden"), [
    # The client knows its backend only through the seam (`client._backend.Backend`).
    ("corral.runtime.client", ("corral.runtime.host", "corral.runtime.ray",
                               "corral.runtime._open")),
    # A host runs the same in a plain process and in a Ray actor.
    ("corral.runtime.host", ("corral.runtime.ray", "corral.runtime._open")),
    ("corral.runtime.ray", ("corral.runtime._open",)),
])
def test_a_runtime_role_imports_no_role_above_it(role: str, forbidden: tuple[str, ...]
                                                 ) -> None:
    graph = import_graph("runtime")
    modules = [m for m in graph if m == role or m.startswith(role + ".")]
    assert len(modules) > 3, role
    bad = {m: sorted(i for i in graph[m] if i.startswith(forbidden)) for m in modules}
    assert not {m: b for m, b in bad.items() if b}


def test_the_modules_shared_by_every_role_import_none_of_them() -> None:
    graph = import_graph("runtime")
    shared = [m for m in graph if m.count(".") == 2 and not m.startswith(ROLES)
              and m != "corral.runtime._open"]
    assert "corral.runtime._clock" in shared
    for module in shared:
        assert not {i for i in graph[module] if i.startswith(ROLES)}, module


def test_an_activation_sees_its_shard_only_through_its_residence() -> None:
    graph = import_graph("runtime")
    host = "corral.runtime.host."
    assert host + "_shard" not in graph[host + "_activation"]
    for module in ("_poison", "_signal_waits", "_suspension", "_residence"):
        reached = graph[host + module]
        assert not {host + "_activation", host + "_shard"} & reached, module

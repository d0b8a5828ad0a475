"""One name, one meaning: an internal class never takes the name of a public one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import corral
import corral.persistence
import corral.runtime


def public_names() -> dict[str, object]:
    """What users import by name: `corral`, `corral.runtime` and `corral.persistence`."""
    found: dict[str, object] = {}
    for package in (corral, corral.runtime, corral.persistence):
        for name in package.__all__:
            found.setdefault(name, getattr(package, name))
    return found


def test_no_class_of_corral_has_the_name_of_another_public_object() -> None:
    # The retry verdict was `DeadLetter`, the name of the stored row users read.
    public = public_names()
    clashes = []
    for info in pkgutil.walk_packages(corral.__path__, "corral."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and value.__module__ == module.__name__
                    and name in public and public[name] is not value):
                clashes.append(f"{module.__name__}.{name}")
    assert clashes == []

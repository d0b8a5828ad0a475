"""Loading an example program (`examples/*.py`, not a package) as a module for a test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(filename: str, module_name: str) -> ModuleType:
    """`examples/<filename>` executed as the module `module_name` (registered in
    `sys.modules`: dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / filename)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

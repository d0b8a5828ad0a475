"""The hash of an entity class's code: what makes a body-only change a new build.

The fingerprint (`EntityDefinition.fingerprint`) covers what callers and hosts agree
on and leaves method bodies out, so a fix inside `run()` keeps it. `code_of` covers the
bodies: the source text of each module that defines the class or one of its bases (a
change anywhere in such a module, e.g. a helper that `run()` calls, is new code),
falling back to the class's own source, then, for a class with no source (made by
`exec` or in a REPL), to its functions' compiled code. corral's own classes and the
standard library's are left out; so is code in other modules the class only imports.

The hashed text holds no ids, addresses or paths: the same code gives the same hash in
every process, on every machine.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from collections.abc import Iterator
from types import CodeType, FunctionType

from ._state import StateUpgrade

__all__ = ["code_of"]


@functools.cache
def code_of(cls: type) -> str:
    """A short hash (16 hex digits) of the code of entity class `cls`.

    Example:
        code_of(Ticket)   # '3f9c0a17b2e4d851', another one after any edit of its module
    """
    digest = hashlib.blake2b(digest_size=8)
    seen: set[str] = set()
    for klass in cls.__mro__:
        if _is_library(klass):
            continue
        source = _module_source(klass)
        if source is not None:
            if klass.__module__ in seen:  # one module defines several of the classes
                continue
            seen.add(klass.__module__)
        else:
            source = _class_source(klass) or _compiled(klass)
        digest.update(len(source).to_bytes(8, "big"))
        digest.update(source)
    return digest.hexdigest()


def _is_library(klass: type) -> bool:
    top = klass.__module__.partition(".")[0]
    return top == "corral" or top in sys.stdlib_module_names


def _module_source(klass: type) -> bytes | None:
    module = sys.modules.get(klass.__module__)
    if module is None:
        return None
    try:
        return inspect.getsource(module).encode()
    except Exception:  # no file (a REPL's __main__, exec): the class's own, or its code
        return None


def _class_source(klass: type) -> bytes | None:
    try:
        return inspect.getsource(klass).encode()
    except Exception:  # no source (exec): its functions' compiled code
        return None


def _compiled(klass: type) -> bytes:
    """The compiled code of the functions in `klass`'s own dict, by name."""
    parts: list[bytes] = []
    for name, value in sorted(vars(klass).items()):
        for fn in _functions(value):
            parts.append(f"def {name}".encode())
            parts.extend(_code_parts(fn.__code__))
    return b"\0".join(parts)


def _functions(value: object) -> Iterator[FunctionType]:
    if isinstance(value, FunctionType):
        yield value
    elif isinstance(value, staticmethod | classmethod):
        yield from _functions(value.__func__)
    elif isinstance(value, property):
        for accessor in (value.fget, value.fset, value.fdel):
            yield from _functions(accessor)
    elif isinstance(value, StateUpgrade):
        yield from _functions(value.fn)


def _code_parts(code: CodeType) -> Iterator[bytes]:
    yield code.co_code
    yield " ".join(code.co_names).encode()  # `self.a` -> `self.b` changes only these
    for const in code.co_consts:
        yield from _const_parts(const)


def _const_parts(const: object) -> Iterator[bytes]:
    if isinstance(const, CodeType):
        yield from _code_parts(const)
    elif isinstance(const, tuple):
        yield b"("
        for item in const:
            yield from _const_parts(item)
        yield b")"
    elif isinstance(const, frozenset):  # its repr's order varies with the hash seed
        yield repr(sorted(repr(item) for item in const)).encode()
    else:
        yield repr(const).encode()

"""A function pickled by value names its source file again on the rank.

cloudpickle carries a function of `__main__` (a script's, a notebook's) by value, and names its code
`<dynamic-code>`: a rank's traceback then says `File "<dynamic-code>", line 5, in train`, with no
file and no source line. The login side records the function's file (`source_of`); the rank gives
it back to the function's code, its nested code (lambdas, inner functions) and the functions and
methods of the same module cloudpickle carried with it (`with_source`).
"""

from __future__ import annotations

import types
from typing import Any

DYNAMIC = "<dynamic-code>"


def source_of(fn: object) -> str | None:
    """The file a function's code names (None for a callable without code: a builtin, a C function)."""
    code = getattr(_function(fn), "__code__", None)
    return code.co_filename if isinstance(code, types.CodeType) else None


def with_source(fn: object, filename: str | None) -> Any:
    """`fn`, its code and that of the functions and classes in its globals named `filename` where
    cloudpickle named them <dynamic-code>; the same object back."""
    func = _function(fn)
    if not filename or filename == DYNAMIC or not isinstance(func, types.FunctionType):
        return fn
    _rename(func, filename)
    for value in list(func.__globals__.values()):
        if isinstance(value, types.FunctionType):
            _rename(value, filename)
        elif isinstance(value, type):
            for attr in list(vars(value).values()):
                if isinstance(inner := _function(attr), types.FunctionType):
                    _rename(inner, filename)
    return fn


def _function(fn: object) -> Any:
    """The plain function under a bound method, a static or class method, or a functools.partial."""
    while not isinstance(fn, types.FunctionType) and (inner := getattr(fn, "__func__", getattr(fn, "func", None))):
        fn = inner
    return fn


def _rename(func: types.FunctionType, filename: str) -> None:
    if func.__code__.co_filename == DYNAMIC:
        func.__code__ = _renamed(func.__code__, filename)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)

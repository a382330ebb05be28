"""Names of a package imported when first used, so that importing the package (or one light module in
it, e.g. its settings) does not import torch, matplotlib or model code.

    __getattr__, __dir__ = lazy_exports(__name__, {"probe": "run", "ProbeResult": "result", ...})

maps each public name to the submodule that defines it ("module:name" when the name there differs).
"""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """`__getattr__` and `__dir__` for the package `package` that import `exports` on first use."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = exports[name].partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attribute or name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__

"""Load a script of the repository (bench/, scripts/) as a module, for tests that check what it computes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: str | Path, name: str, *, register: bool = False) -> ModuleType:
    """The module of the script at `path`, named `name`; `register` puts it in sys.modules first (a script whose
    dataclasses or pickles look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, Path(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod

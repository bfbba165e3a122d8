# SPDX-License-Identifier: Apache-2.0
"""Loading the GPU machine's scripts (scripts/h200/*.py) as modules, so that tests check them before device time is
spent on them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "h200"


def load(name: str) -> ModuleType:
    """scripts/h200/<name>.py as a module (its ``if __name__ == "__main__"`` part does not run)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there while the class is being made
    spec.loader.exec_module(module)
    return module

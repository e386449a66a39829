"""Load ``bench/bench_abr.py`` as a module for the tests that drive its runs (it is a script, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_ABR = Path(__file__).resolve().parents[2] / "bench" / "bench_abr.py"


def load_bench_abr() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_abr", BENCH_ABR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_abr"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module

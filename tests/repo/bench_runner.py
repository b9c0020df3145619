"""Run a bench/ script's main in-process, with some of its module constants overridden."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def _siblings_importable() -> None:
    """bench/ on the path, as `python bench/<script>` has it (a script imports its siblings)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, imported as a bench script imports it."""
    _siblings_importable()
    return importlib.import_module(name)


def run_bench(script: str, argv: list[str], **constants: Any) -> int:
    """Load bench/<script> as a module, override its module constants, and run main(argv)."""
    _siblings_importable()
    spec = importlib.util.spec_from_file_location(f"bench_{Path(script).stem}", BENCH_DIR / script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        for name, value in constants.items():
            assert hasattr(module, name), name
            setattr(module, name, value)
        code: int = module.main(argv)
    finally:
        sys.modules.pop(spec.name, None)
    return code

"""Run a bench/ script's main in-process, with some of its module constants overridden."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, argv: list[str], **constants: Any) -> int:
    """Load bench/<script> as a module, override its module constants, and run main(argv)."""
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

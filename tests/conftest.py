"""What every tier shares: tests/ on sys.path, for `tiers` (tests/tiers.py, skip or fail)."""

from __future__ import annotations

import sys
from pathlib import Path

# pytest's default import mode puts this folder on sys.path too; saying it keeps `import tiers`
# working under --import-mode=importlib, which does not.
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

"""What every tier shares: tests/ on sys.path, so that each tier imports `tiers` (the one
skip-or-fail rule for servers that cannot start here, see tests/tiers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

# pytest's default import mode puts this folder on sys.path too; saying it keeps `import tiers`
# working under --import-mode=importlib, which does not.
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

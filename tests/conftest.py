"""What every tier shares: tests/ on sys.path (for `tiers`, tests/tiers.py: skip or fail), the
k8s and triton tiers' folders too (their helper modules: cluster, node, e2e_shared, ragsim, ...),
and the control plane's fixtures (tests/k8s/k8s_fixtures.py), which the k8s and e2e tiers use.

pytest takes `pytest_plugins` only from this, the top conftest; each tier's own fixtures are in
its conftest.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# pytest's default import mode puts a test's folder on sys.path as it imports it; saying it here
# keeps `import tiers` and the plugin below working under --import-mode=importlib too, and for a
# tier that imports another's helpers (the e2e tier: tests/k8s's, tests/triton's).
TESTS = Path(__file__).resolve().parent
for _folder in (TESTS / "triton", TESTS / "k8s", TESTS):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

# The control plane's fixtures for every tier (one control plane a session, started when a test
# asks for it); tests/k8s/conftest.py has the k8s tier's own.
pytest_plugins = ["k8s_fixtures"]

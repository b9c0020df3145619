"""Fixtures for the e2e tier: the k8s tier's control plane and node, the triton tier's Triton and
Prometheus, reused as they are.

Every tier's conftest is a module named `conftest`, so the k8s and triton tiers' conftest files
are loaded here under names of their own and their fixtures re-exported; their helper modules
(cluster, node, operator_process, e2e_shared; ragsim) are importable because both folders go on
sys.path. The fixtures therefore skip here for the same reasons as in their own tiers (or fail
under COMPASS_REQUIRE_TIERS=1, tests/tiers.py): no Kubernetes control plane, no tritonserver, no
prometheus. Fixtures are per folder in pytest, so a run of the whole suite starts this tier's own
session-wide control plane, Triton and Prometheus.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parents[1]
for _tier in ("k8s", "triton"):
    if str(TESTS / _tier) not in sys.path:
        sys.path.insert(0, str(TESTS / _tier))


def _tier_conftest(tier: str) -> ModuleType:
    """tests/<tier>/conftest.py as a module of its own (not the `conftest` pytest imported)."""
    spec = importlib.util.spec_from_file_location(
        f"{tier}_tier_conftest", TESTS / tier / "conftest.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_k8s = _tier_conftest("k8s")
_triton = _tier_conftest("triton")

k8s_binaries = _k8s.k8s_binaries
k8s_cluster = _k8s.k8s_cluster
k8s_api = _k8s.k8s_api
k8s_node = _k8s.k8s_node
k8s_namespace = _k8s.k8s_namespace
triton = _triton.triton  # rag-sim at ragsim.TIME_SCALE, FASTEST active
prometheus = _triton.prometheus  # scraping that Triton's /metrics every 0.5 s
rag_sim_data = _triton.rag_sim_data

"""Two `compass operator` processes, each owning a shard of the ParetoPolicies (a namespace each,
as two releases of the chart with their own watchNamespaces): every policy is acted on by
exactly one of them, also while one of them is killed and started again.

A real API server, a real tritonserver with rag-sim; each policy names a Service of its own (one
actor per routing target), which the operators' address override sends to the one Triton. Which
process acts on a policy is observable: only the one deciding for it exports its gauges.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, temporary_namespace, wait_for
from e2e_shared import Policies, policy_spec
from kubernetes import client
from operator_process import Operator

from compass_dev.local_triton import LocalTriton

PER_SHARD = 3
# A restarted operator acts on every policy of its shard again within this (issue 45's bound).
RESTART_S = 30.0


def acting(operator: Operator) -> set[tuple[str, str]]:
    """(namespace, policy) of every policy this process has acted on (its Ready gauge)."""
    try:
        text = operator.metrics()
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        if line.startswith("compass_policy_ready{"):
            labels = dict(
                part.split("=", 1) for part in line.split("{", 1)[1].split("}", 1)[0].split(",")
            )
            found.add((labels["namespace"].strip('"'), labels["policy"].strip('"')))
    return found


@pytest.fixture
def shards(k8s_api: Any, crds: None, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """Two namespaces, one a shard."""
    suffix = time.monotonic_ns() % 100000
    with (
        temporary_namespace(k8s_api, f"shard-a-{suffix}", admit_pods=True) as first,
        temporary_namespace(k8s_api, f"shard-b-{suffix}", admit_pods=True) as second,
    ):
        yield first, second


def test_each_policy_is_acted_on_by_exactly_one_shard_also_while_one_restarts(
    k8s_cluster: Cluster,
    k8s_api: Any,
    shards: tuple[str, str],
    triton: LocalTriton,
    tmp_path: Path,
) -> None:
    env = {"COMPASS_TRITON_ADDRESS_OVERRIDE": triton.grpc_url}
    operators = [
        Operator(k8s_cluster, namespace, tmp_path / f"{namespace}.log", env=env)
        for namespace in shards
    ]
    made = [
        Policies(client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api), namespace)
        for namespace in shards
    ]
    try:
        for operator in operators:
            operator.start()
        for policies in made:
            for index in range(PER_SHARD):
                spec = policy_spec(triton)
                spec["routing"] = {"service": f"triton-{index}", "routerModel": "router"}
                policies.create(f"p{index}", spec)
        owned = [{(p.namespace, name) for name in p.created} for p in made]

        def each_acts_on_its_own() -> bool:
            return all(acting(o) == mine for o, mine in zip(operators, owned, strict=True))

        wait_for(each_acts_on_its_own, 60, "each shard acting on its own policies", 0.5)

        operators[0].kill()
        restarted = time.monotonic()
        operators[0].start()
        # While the first shard's process is down and coming back, the other one never takes
        # any of its policies, and keeps acting on its own.
        while not acting(operators[0]) >= owned[0]:
            assert acting(operators[1]) == owned[1]
            assert time.monotonic() - restarted < RESTART_S, "the restarted shard is not acting"
            time.sleep(0.5)
        assert each_acts_on_its_own()
    finally:
        for operator in operators:
            print(f"{operator.log.name}:\n{operator.tail()}")
        for policies in made:
            policies.delete_all()
        for operator in operators:
            operator.stop()

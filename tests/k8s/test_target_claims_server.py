"""One router, one key, on a real API server and a real Triton: two ParetoPolicies naming one
Triton under two spellings (127.0.0.1:P and localhost:P) do not both drive it; the younger
gets TargetClaimed naming the older, and switches nothing until the older goes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster import Cluster, temporary_namespace, wait_for
from e2e_shared import Policies, condition, policy_spec, wait_active
from kubernetes import client
from operator_process import Operator

from compass.dataplane.triton import TritonRouter
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import ACCURATE


def test_a_second_spelling_of_one_triton_is_claimed_by_the_older_policy(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    assert triton.host == "127.0.0.1"
    policies.create("older", policy_spec(triton))  # grpcEndpoint 127.0.0.1:P
    wait_active(policies, "older", router, ACCURATE, 20)  # it acts: idle, it climbs
    time.sleep(1.1)  # a later creationTimestamp (whole seconds) for the younger
    routing = {"grpcEndpoint": f"localhost:{triton.grpc_port}", "routerModel": "router"}
    policies.create("younger", policy_spec(triton, routing=routing))

    def claimed() -> dict[str, str] | None:
        ready = condition(policies.status("younger"), "Ready")
        return ready if ready.get("reason") == "TargetClaimed" else None

    ready = wait_for(claimed, 15, "the younger policy to be told the target is claimed")
    assert ready["status"] == "False"
    assert "ParetoPolicy older (older) acts on the same routing target" in ready["message"]
    time.sleep(3)  # past the 2 s cooldown: a policy that acted would have switched
    assert policies.status("younger").get("switches", 0) == 0
    assert condition(policies.status("older"), "Ready")["status"] == "True"


def _ready(policies: Policies, name: str, reason: str) -> Callable[[], dict[str, str] | None]:
    def check() -> dict[str, str] | None:
        found = condition(policies.status(name), "Ready")
        return found if found.get("reason") == reason else None

    return check


def test_a_policy_moved_to_another_namespace_leaves_no_claim_behind(
    k8s_cluster: Cluster, k8s_api: Any, crds: None, triton: LocalTriton, tmp_path: Path
) -> None:
    """One operator over two namespaces (issue 62 item 7b): `p` in the first holds the router
    and `q` in the second is TargetClaimed naming it across namespaces; `p` deleted and made
    again, same name, in the second namespace: `q`, now the oldest, acts, the new `p` is
    TargetClaimed naming `q`, and the first namespace's `p` leaves no claim, series or tick."""
    suffix = time.monotonic_ns() % 100000
    with (
        temporary_namespace(k8s_api, f"move-a-{suffix}", admit_pods=True) as first,
        temporary_namespace(k8s_api, f"move-b-{suffix}", admit_pods=True) as second,
    ):
        custom, core = client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api)
        before, after = Policies(custom, core, first), Policies(custom, core, second)
        operator = Operator(
            k8s_cluster, first, tmp_path / "operator.log", args=("--namespace", second)
        )
        operator.start()
        try:
            before.create("p", policy_spec(triton))
            wait_for(_ready(before, "p", "Serving"), 20, "p to act")
            time.sleep(1.1)  # a later creationTimestamp (whole seconds)
            after.create("q", policy_spec(triton))
            claimed = wait_for(_ready(after, "q", "TargetClaimed"), 15, "q to be claimed")
            assert f"ParetoPolicy {first}/p" in claimed["message"]

            before.delete_all()
            time.sleep(1.1)
            routing = {"grpcEndpoint": f"localhost:{triton.grpc_port}", "routerModel": "router"}
            after.create("p", policy_spec(triton, routing=routing))
            wait_for(_ready(after, "q", "Serving"), 15, "q, now the oldest, to act")
            claimed = wait_for(_ready(after, "p", "TargetClaimed"), 15, "the new p to be claimed")
            assert "ParetoPolicy q (older) acts" in claimed["message"]
            assert first not in claimed["message"]

            def series_of_the_first_gone() -> bool:
                return f'namespace="{first}"' not in _ready_series(operator)

            wait_for(series_of_the_first_gone, 15, "the deleted policy's series to go")
            time.sleep(3)  # past the 2 s cooldown: a policy that acted would have switched
            assert after.status("p").get("switches", 0) == 0
            assert condition(after.status("q"), "Ready")["reason"] == "Serving"
        finally:
            print(f"operator log:\n{operator.tail()}")
            after.delete_all()
            before.delete_all()
            operator.stop()


def _ready_series(operator: Operator) -> str:
    """The operator's compass_policy_ready lines (one per policy it acts on)."""
    return "\n".join(
        line for line in operator.metrics().splitlines() if line.startswith("compass_policy_ready{")
    )

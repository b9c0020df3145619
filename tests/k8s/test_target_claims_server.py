"""One router, one key, on a real API server and a real Triton: two ParetoPolicies naming one
Triton under two spellings (127.0.0.1:P and localhost:P) do not both drive it; the younger
gets TargetClaimed naming the older, and switches nothing until the older goes."""

from __future__ import annotations

import time

from cluster import wait_for
from e2e_shared import Policies, condition, policy_spec, wait_active

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

"""Client deadlines at the router's gate on a real Triton: one client sending extreme
compass_deadline_ns values (past, zero, int64's end, 10**30, thousands of digits) gets its own
requests refused as late or served within bounds, and another client's requests, bound behind
the same gate by the lag cap on static fastest's shared schedule, are served as before; one
waiting behind another client's request with a tight deadline does not hurry it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from ragsim import ACCURATE, FASTEST
from tritonclient.utils import InferenceServerException

from compass.dataplane.triton import LATE_MESSAGE, TritonRouter, request_tensor
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import rag_sim_triton
from compass_rules.deadlines import DEADLINE_PARAMETER
from tiers import require_tritonserver

INSTANCES = 8
# The table's times: a request alone may take ACCURATE's 900 ms more than FASTEST only where
# the lag cap allows it; lag_share 0.1 of the 6 s SLO (600 ms) does not.
FASTEST_MS, ACCURATE_MS, SLO_MS, LAG_SHARE = 100.0, 1_000.0, 6_000.0, 0.1
# The attacker's deadlines, as a client can send them (Triton's int64 parameter, or a string).
EXTREMES: list[int | str] = [
    2**62,
    2**63 - 1,
    -1,
    0,
    1,
    str(2**63),
    "1" + "0" * 30,
    "9" * 4000,
    "-" + "9" * 4000,
]
VICTIM_REQUESTS = 4


def _table() -> dict[str, Any]:
    return {
        "stages": [list(names) for names in RAG_SIM_STAGE_PARAMS],
        "components": list(RAG_SIM_COMPONENTS),
        "configs": [
            {"config": config_key(FASTEST), "accuracy": 0.80, "stage_ms": [0.0, 0.0, FASTEST_MS]},
            {"config": config_key(ACCURATE), "accuracy": 0.86, "stage_ms": [0.0, 0.0, ACCURATE_MS]},
        ],
        "slo_ms": SLO_MS,
        "lag_share": LAG_SHARE,
        "lag_reserve": 0,
    }


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonRouter]:
    """rag-sim behind a gate of 1 slot, late binding on with the lag cap."""
    require_tritonserver()
    workdir: Path = tmp_path_factory.mktemp("gated")
    server: LocalTriton = rag_sim_triton(
        workdir, 1.0, FASTEST, router_instances=INSTANCES, pipeline_slots=1
    ).start(workdir)
    client = TritonRouter(server.grpc_url, backoff_s=0.05)
    client.binding = _table()
    client.switch(FASTEST)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def _victim(router: TritonRouter) -> list[str]:
    """What another client's requests (no deadline: the table's SLO from take-up) are served
    on, each once the schedule the requests before it drew has passed."""
    served = []
    for index in range(VICTIM_REQUESTS):
        served.append(router.infer({"sample": index}).config)
        time.sleep(2 * FASTEST_MS / 1000)
    return served


def _attack(router: TritonRouter, deadline: int | str) -> str:
    """One request with this deadline: the configuration that served it, or the error."""
    try:
        response = router.client.infer(
            router.model,
            [request_tensor({"sample": 7})],
            parameters={DEADLINE_PARAMETER: deadline},
            client_timeout=30,
        )
    except InferenceServerException as error:
        return f"error: {error.message()}"
    config = response.as_numpy("CONFIG")
    assert config is not None
    return str(config[0].decode())


def test_one_clients_extreme_deadlines_leave_another_clients_service_as_it_was(
    gated: TritonRouter,
) -> None:
    before = _victim(gated)
    # The lag cap holds a request alone to FASTEST (ACCURATE would fit its SLO).
    assert before == [config_key(FASTEST)] * VICTIM_REQUESTS
    outcomes = {str(value)[:24]: _attack(gated, value) for value in EXTREMES}
    # Each is refused as late (past), or served (clamped within a few SLOs): never a crash.
    for value, outcome in outcomes.items():
        assert outcome in (config_key(FASTEST), config_key(ACCURATE)) or (
            LATE_MESSAGE in outcome
        ), (value, outcome)
    # Past: late whatever serves it, so refused or (this table does not refuse) the fastest.
    for past in ("-1", "0", "1", "-" + "9" * 23):
        assert outcomes[past] == config_key(FASTEST) or LATE_MESSAGE in outcomes[past], past
    # Past the schedule the attacker's requests drew (one fastest's turn each).
    time.sleep(len(EXTREMES) * FASTEST_MS / 1000 + 0.5)
    assert _victim(gated) == before, outcomes


# Per this table, ACCURATE takes 10 s and FASTEST 1 s of a 60 s SLO (rag-sim serves each in
# some 0.3 s): alone, a request binds ACCURATE; behind it, a follower with TIGHT_S left as its
# client sent it (a slack of about 2.7 s, short of ACCURATE's 9 s more) would hurry it.
NO_CAP_TABLE_MS = (1_000.0, 10_000.0, 60_000.0)
TIGHT_S = 5.0
SEND_GAP_S = 0.02


def _no_cap_table() -> dict[str, Any]:
    fastest, accurate, slo = NO_CAP_TABLE_MS
    return {
        **_table(),
        "configs": [
            {"config": config_key(FASTEST), "accuracy": 0.80, "stage_ms": [0.0, 0.0, fastest]},
            {"config": config_key(ACCURATE), "accuracy": 0.86, "stage_ms": [0.0, 0.0, accurate]},
        ],
        "slo_ms": slo,
        "lag_share": None,
    }


def _behind_a_blocker(router: TritonRouter, tight: bool) -> tuple[str, str]:
    """The victim's request (no deadline) queued behind one that holds the pipeline, and one
    of the attacker's behind it (``tight``: TIGHT_S from now, else none): what each was
    served on."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        blocker = pool.submit(router.infer, {"sample": 99}, ACCURATE)
        time.sleep(SEND_GAP_S)
        victim = pool.submit(router.infer, {"sample": 1})
        time.sleep(SEND_GAP_S)
        if tight:
            attacker = pool.submit(_attack, router, time.time_ns() + round(TIGHT_S * 1e9))
        else:
            attacker = pool.submit(lambda: router.infer({"sample": 7}).config)
        blocker.result()
        return victim.result().config, attacker.result()


def test_a_followers_tight_deadline_does_not_hurry_another_clients_request_ahead(
    gated: TritonRouter,
) -> None:
    gated.binding = _no_cap_table()
    gated.switch(FASTEST)  # the table goes to the routers with a switch
    try:
        ordinary = _behind_a_blocker(gated, tight=False)
        tight = _behind_a_blocker(gated, tight=True)
    finally:
        gated.binding = _table()
        gated.switch(FASTEST)
    # Behind an ordinary request and behind the tight one alike, the victim binds ACCURATE.
    assert ordinary[0] == tight[0] == config_key(ACCURATE), (ordinary, tight)
    # The tight deadline binds its own request: FASTEST is what fits it.
    assert tight[1] == config_key(FASTEST), tight

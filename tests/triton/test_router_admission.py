"""Admission at dispatch on a real Triton: a request that carries its deadline is served as
routed, on the fastest configuration, or refused (retryable) when it would be late anyway
(served on the fastest where the table says not to refuse)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from ragsim import ACCURATE, FASTEST
from tritonclient.utils import InferenceServerException

from compass.dataplane.load import run_load
from compass.dataplane.triton import (
    LATE_MESSAGE,
    RoutingError,
    TritonRouter,
    request_tensor,
)
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_rules.deadlines import DEADLINE_PARAMETER

SLOW_MS = 10_000.0


def _table(accurate_ms: float, fastest_ms: float = 0.0) -> dict[str, object]:
    return {
        "quantiles_ms": {config_key(ACCURATE): accurate_ms, config_key(FASTEST): fastest_ms},
        "fastest": config_key(FASTEST),
    }


def _in(seconds: float) -> int:
    return time.time_ns() + round(seconds * 1e9)


@pytest.fixture
def admitting(router: TritonRouter) -> Iterator[TritonRouter]:
    """The router on ACCURATE with admission judging ACCURATE at 10 s and FASTEST at 0 ms."""
    router.admission = _table(SLOW_MS)
    router.switch(ACCURATE)
    yield router
    router.admission = None


def test_a_request_that_would_be_late_is_served_on_the_fastest(admitting: TritonRouter) -> None:
    """1 s left: ACCURATE (10 s) would miss it, FASTEST fits; with 60 s left ACCURATE serves."""
    assert admitting.infer({"sample": 0}, deadline_ns=_in(1.0)).config == config_key(FASTEST)
    assert admitting.infer({"sample": 1}, deadline_ns=_in(60.0)).config == config_key(ACCURATE)
    # Without a deadline, or with an override, a request is served as before.
    assert admitting.infer({"sample": 2}).config == config_key(ACCURATE)
    override = admitting.infer({"sample": 3}, config=ACCURATE, deadline_ns=_in(1.0))
    assert override.config == config_key(ACCURATE)


def test_a_request_that_waited_long_is_served_on_the_fastest(router: TritonRouter) -> None:
    """With degrade_below_ms, a request with less than that left (it waited: a queue stands
    behind it) is served on the fastest although ACCURATE would still fit; more left, as
    routed."""
    router.admission = {**_table(100.0), "degrade_below_ms": 30_000.0}
    router.switch(ACCURATE)
    try:
        waited = router.infer({"sample": 0}, deadline_ns=_in(20.0))
        fresh = router.infer({"sample": 1}, deadline_ns=_in(60.0))
    finally:
        router.admission = None
    assert waited.config == config_key(FASTEST)
    assert fresh.config == config_key(ACCURATE)


def test_a_request_late_whatever_serves_it_is_refused_with_the_reason(
    admitting: TritonRouter,
) -> None:
    with pytest.raises(RoutingError, match=LATE_MESSAGE) as refused:
        admitting.infer({"sample": 0}, deadline_ns=_in(-1.0))
    assert "retry later" in str(refused.value)
    # The refusal is per request: the next one is served.
    assert admitting.infer({"sample": 1}).config == config_key(ACCURATE)


def test_refusing_nothing_serves_a_late_request_on_the_fastest(router: TritonRouter) -> None:
    """With refuse false in the table, what no configuration brings in time is served on the
    fastest (the client cannot retry), not refused."""
    router.admission = {**_table(SLOW_MS, 1_000.0), "refuse": False}
    router.switch(ACCURATE)
    try:
        late = router.infer({"sample": 0}, deadline_ns=_in(-1.0))
        fresh = router.infer({"sample": 1}, deadline_ns=_in(60.0))
    finally:
        router.admission = None
    assert late.config == config_key(FASTEST)
    assert fresh.config == config_key(ACCURATE)


def test_a_deadline_that_is_not_a_time_fails_that_request_naming_the_parameter(
    admitting: TritonRouter,
) -> None:
    with pytest.raises(InferenceServerException, match="compass_deadline_ns 'soon' is not an"):
        admitting.client.infer(
            admitting.model,
            [request_tensor({"sample": 0})],
            parameters={DEADLINE_PARAMETER: "soon"},
        )
    assert admitting.infer({"sample": 1}).config == config_key(ACCURATE)


def test_admission_is_off_after_a_switch_without_a_table(admitting: TritonRouter) -> None:
    admitting.admission = None
    admitting.switch(ACCURATE)
    assert admitting.infer({"sample": 0}, deadline_ns=_in(-1.0)).config == config_key(ACCURATE)


def test_a_bad_table_is_refused_and_changes_nothing(admitting: TritonRouter) -> None:
    admitting.admission = {"quantiles_ms": {config_key(ACCURATE): -1}, "fastest": "{}"}
    with pytest.raises(RoutingError, match="admission: quantile -1"):
        admitting.switch(FASTEST)
    admitting.admission = {**_table(1.0), "degrade_below_ms": "soon"}
    with pytest.raises(RoutingError, match="admission: degrade_below_ms 'soon'"):
        admitting.switch(FASTEST)
    admitting.admission = {**_table(1.0), "refuse": "no"}
    with pytest.raises(RoutingError, match="admission: refuse 'no' is not true or false"):
        admitting.switch(FASTEST)
    admitting.admission = None
    assert admitting.active_config() == config_key(ACCURATE)
    # The table from before still judges.
    assert admitting.infer({"sample": 0}, deadline_ns=_in(1.0)).config == config_key(FASTEST)


def test_under_a_burst_late_requests_are_refused_and_none_fails(
    triton: LocalTriton, admitting: TritonRouter
) -> None:
    """40 requests at once on one router instance with deadlines of 0.3 s and the services
    judged as they are (rag-sim's ACCURATE at its profile): the queue makes the later ones
    late; they are refused or degraded, never failed, and the ones served are in time."""
    started = time.perf_counter()
    mean_s = admitting.infer({"sample": 0}, config=ACCURATE).latency_s
    fastest_s = admitting.infer({"sample": 0}, config=FASTEST).latency_s
    assert time.perf_counter() - started < 10
    admitting.admission = _table(mean_s * 1000, fastest_s * 1000)
    admitting.switch(ACCURATE)
    deadline_s = 4 * mean_s
    records = run_load(triton.grpc_url, [0.0] * 40, lambda i: {"sample": i}, deadline_s=deadline_s)
    refused = [r for r in records if r.refused]
    assert not [r for r in records if r.error and not r.refused]
    assert refused, "a burst ten times the deadline's worth of work refused nothing"
    assert all("UNAVAILABLE" in (r.error or "") for r in refused)  # retryable
    served = [r for r in records if r.error is None]
    assert {r.config for r in served} >= {config_key(ACCURATE)}
    late = [r for r in served if r.latency_s > deadline_s * 1.5]
    assert len(late) <= 2, [round(r.latency_s, 3) for r in late]

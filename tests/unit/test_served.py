"""What the routers served, as a policy's status shows it: their counters differenced over the
last minute (a restarted router's counters counted from zero, never negative), named and
weighed by the plan's front, with a streaming router's mean time to first token and to a
stream's end; and the routers' counters read off a Triton metrics page, whose config label is
JSON (braces and escaped quotes inside a label value)."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from compass.api.paretopolicy_status import ParetoPolicyStatus
from compass.controllers import policy_compile, policy_publish, policy_status
from compass.controllers.policy_publish import PolicyMemory
from compass.controllers.policy_status import PolicyGauges, with_stream_times
from compass.controllers.runtime import OperatorMetrics
from compass.dataplane.fleet import Endpoint, FleetQueueDepth
from compass.dataplane.metrics import TritonQueueDepth
from compass.domain.served import (
    MAX_SHOWN,
    SAMPLE_EVERY_S,
    CounterHistory,
    RouterCounters,
    ServedCounts,
    StreamCounts,
    served_view,
    summed,
)
from compass_dev.processes import QuietHandler, serve_http
from compass_rules.protocol import (
    SERVED_METRIC,
    STREAM_END_METRIC,
    STREAM_FIRST_METRIC,
    STREAMS_METRIC,
)

FAST = json.dumps({"model": "small", "k": 1}, sort_keys=True)
SLOW = json.dumps({"model": "large", "k": 3}, sort_keys=True)


def _counters(fast: float, slow: float = 0.0, refused: float = 0.0) -> RouterCounters:
    """One pod's counters, all on one instance."""
    return RouterCounters({(FAST, "i0"): fast, (SLOW, "i0"): slow}, {"i0": refused})


def _counts(fast: float, slow: float = 0.0, refused: float = 0.0) -> ServedCounts:
    return ServedCounts({FAST: fast, SLOW: slow}, refused)


def test_the_window_counts_what_was_served_within_it() -> None:
    history = CounterHistory()
    for step, (fast, slow) in enumerate([(0, 0), (10, 0), (10, 5), (12, 9)]):
        history.add(100.0 + 10 * step, _counters(fast, slow))
    window = history.since(130.0, 60.0)
    assert window is not None
    assert dict(window.configs) == {FAST: 12.0, SLOW: 9.0}
    assert window.seconds == 30.0
    # 15 s back: the pair across its start (t = 110 to 120) counts its last half.
    recent = history.since(130.0, 15.0)
    assert recent is not None
    assert dict(recent.configs) == {FAST: 2.0, SLOW: 6.5}
    assert recent.seconds == 15.0


def test_after_a_gap_in_the_readings_only_the_windows_share_counts() -> None:
    # A pod unreadable for 600 s that served a request a second all along: the minute counts
    # a minute's worth, not the ten it could not see.
    history = CounterHistory()
    history.add(0.0, _counters(0))
    history.add(600.0, _counters(600))
    window = history.since(600.0, 60.0)
    assert window is not None
    assert window.configs[FAST] == pytest.approx(60.0)
    assert window.seconds == 60.0


def test_an_instance_that_restarted_counts_from_zero_the_others_as_they_were() -> None:
    def pod(first: float, second: float, refused: float = 0.0) -> RouterCounters:
        return RouterCounters({(FAST, "i0"): first, (FAST, "i1"): second}, {"i0": refused})

    history = CounterHistory()
    history.add(0.0, pod(1000, 1000, refused=4))
    history.add(10.0, pod(1005, 1005, refused=4))
    history.add(20.0, pod(1010, 2, refused=1))  # i1 restarted; i0 did not
    window = history.since(20.0, 60.0)
    assert window is not None
    assert window.configs[FAST] == 5 + 5 + 5 + 2
    assert window.refused == 1.0  # i0's refusals went 4 -> 4 -> 1: it restarted


def test_one_reading_is_no_window_and_samples_are_kept_apart() -> None:
    history = CounterHistory()
    history.add(0.0, _counters(0))
    assert history.since(0.0, 60.0) is None
    for tick in range(1, 200):  # a reading every second
        history.add(float(tick), _counters(tick))
    times = [t for t, _ in history.samples]
    assert times[-1] == 199.0  # the newest reading is always there
    assert all(b - a >= SAMPLE_EVERY_S for a, b in itertools.pairwise(times[:-1]))
    assert times[0] <= 199.0 - 60.0 < times[1]  # kept back to just before the longest window
    window = history.since(199.0, 60.0)
    assert window is not None
    assert window.seconds == 60.0
    assert window.configs[FAST] == pytest.approx(60.0)  # a request a second


def test_the_view_names_and_weighs_by_the_front() -> None:
    known = {FAST: ("small/1", 0.70), SLOW: ("large/3", 0.90)}
    other = json.dumps({"k": 2, "model": "medium"}, sort_keys=True)
    counts = ServedCounts({FAST: 30.0, SLOW: 10.0, other: 10.0}, refused=2.0, seconds=60.0)
    view = served_view(counts, known)
    assert (view.answered, view.refused, view.seconds) == (50, 2, 60.0)
    # The mean of what is on the front (the other configuration's accuracy is not known).
    assert view.accuracy == pytest.approx((30 * 0.70 + 10 * 0.90) / 40)
    assert [(s.name, s.share) for s in view.shares] == [
        ("small/1", 0.6),
        ("2/medium", 0.2),  # named by its values (its canonical key's order)
        ("large/3", 0.2),
    ]
    many = ServedCounts({f"k{i}": 1.0 for i in range(MAX_SHOWN + 2)}, seconds=60.0)
    assert len(served_view(many, known).shares) == MAX_SHOWN
    assert served_view(ServedCounts(), known).accuracy is None


def test_pods_add_up() -> None:
    total = summed([_counts(1, 2, 3), _counts(10, 0, 1)])
    assert total is not None
    assert (dict(total.configs), total.refused) == ({FAST: 11.0, SLOW: 2.0}, 4.0)
    assert summed([]) is None


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


@pytest.fixture
def pod() -> Iterator[dict[str, float | str]]:
    """A Triton metrics page with the router's counters, as its exposition writes them."""
    counters: dict[str, float | str] = {"fast": 0.0, "slow": 0.0, "refused": 0.0}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            lines = [
                'nv_inference_pending_request_count{model="router",version="1"} 2',
                'nv_inference_request_success{model="router",version="1"} 10',
                'nv_inference_request_failure{model="router",version="1"} 0',
                f'{SERVED_METRIC}{{model="router",instance="router_0",config="{_escaped(FAST)}"}}'
                f" {counters['fast']}",
                f'{SERVED_METRIC}{{model="router",instance="router_1",config="{_escaped(FAST)}"}}'
                f" {counters['fast']}",
                f'{SERVED_METRIC}{{model="router",instance="router_0",config="{_escaped(SLOW)}"}}'
                f" {counters['slow']}",
                f'{SERVED_METRIC}{{model="other",instance="x",config="{_escaped(SLOW)}"}} 99',
                f'compass_router_refused_total{{model="router",instance="router_0"}} '
                f"{counters['refused']}",
            ]
            self.send_response(200)
            self.end_headers()
            self.wfile.write("\n".join(lines).encode())

    with serve_http(Handler) as address:
        counters["url"] = f"http://{address}/metrics"
        yield counters


def test_a_scrape_reads_the_counters_by_configuration(
    pod: dict[str, float | str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("compass.dataplane.metrics.time.monotonic", lambda: clock[0])
    source = TritonQueueDepth(str(pod["url"]), "router")
    reading = source.read()
    assert reading.queue_depth == 2.0  # the queue is read as before, JSON labels or not
    assert source.served(60.0) is None  # one reading: no window yet
    pod.update(fast=5.0, slow=2.0, refused=1.0)
    clock[0] += 10.0
    source.read()
    window = source.served(60.0)
    assert window is not None
    # Both instances' series of a configuration add up; another model's are not counted.
    assert dict(window.configs) == {FAST: 10.0, SLOW: 2.0}
    assert window.refused == 1.0
    # A counter that cannot be read costs the view, never the queue's reading.
    pod.update(fast="1e300")
    clock[0] += 10.0
    assert source.read().queue_depth == 2.0
    assert source.served(60.0) == window  # nothing new counted from the bad page
    pod.update(fast=5.0)
    fleet = FleetQueueDepth(lambda: [Endpoint("p0", "127.0.0.1:1", str(pod["url"]))], "router")
    fleet.read()
    pod.update(fast=6.0)
    clock[0] += 10.0
    fleet.read()
    by_fleet = fleet.served(60.0)
    assert by_fleet is not None
    assert dict(by_fleet.configs) == {FAST: 2.0}


def test_a_failing_served_read_keeps_the_last_view_and_raises_nothing() -> None:
    """status.served is read at most once a heartbeat, only on a tick whose queue was read,
    and whatever that read raises (a bug included) costs the view alone."""
    plan = policy_compile.compile_policy(_policy_spec(), generation=1)
    fast_key = plan.plan.thresholds[0].profile.key

    answers: list[ServedCounts | Exception] = [
        ServedCounts({fast_key: 10.0}, 0.0, 60.0),
        RuntimeError("a bug"),
    ]

    class Source:
        asked = 0

        def served(self, window_s: float) -> ServedCounts | None:
            Source.asked += 1
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    memory = PolicyMemory(connections=SimpleNamespace(source=Source()))  # type: ignore[arg-type]
    log = logging.getLogger("test")
    first = policy_publish._served(memory, plan, 100.0, log, observed=True)
    assert first is not None
    assert first["requests"] == 10
    # Not due again within the heartbeat, nor on a tick without an observation.
    assert policy_publish._served(memory, plan, 101.0, log, observed=True) is first
    assert policy_publish._served(memory, plan, 200.0, log, observed=False) is first
    assert Source.asked == 1
    assert policy_publish._served(memory, plan, 200.0, log, observed=True) is first
    assert Source.asked == 2


def _policy_spec() -> dict[str, Any]:
    """A two-member policy (camelCase, as the API server hands it over)."""
    return {
        "front": [
            {"config": {"model": "small"}, "accuracy": 0.7, "latencyMeanMs": 20, "latencyP95Ms": 23},
            {"config": {"model": "large"}, "accuracy": 0.9, "latencyMeanMs": 33, "latencyP95Ms": 37},
        ],
        "slo": {"latencyMs": 150},
        "routing": {"grpcEndpoint": "triton.serving:8001"},
    }  # fmt: skip


# A decoupled router's stream counters: the mean time to first token and to a stream's end
# over status.served's window.
def _streaming(
    streams: float, first_s: float, end_s: float, instance: str = "i0"
) -> RouterCounters:
    """One pod's counters, a streaming router's: each stream served FAST."""
    return RouterCounters(
        {(FAST, instance): streams},
        {instance: 0.0},
        {instance: StreamCounts(streams, first_s, end_s)},
    )


def test_the_window_means_the_streams_answered_within_it() -> None:
    history = CounterHistory()
    # 100 streams before the window (slow ones) are not counted; 10 within it, 40 ms to the
    # first token and 200 ms to the end each.
    history.add(0.0, _streaming(100, 100 * 0.5, 100 * 2.0))
    history.add(60.0, _streaming(110, 100 * 0.5 + 10 * 0.04, 100 * 2.0 + 10 * 0.2))
    window = history.since(60.0, 60.0)
    assert window is not None
    assert window.streams is not None
    assert window.streams.streams == pytest.approx(10)
    assert window.streams.mean_first_s == pytest.approx(0.04)
    assert window.streams.mean_end_s == pytest.approx(0.2)
    view = served_view(window, {})
    assert (view.ttft_mean_s, view.stream_mean_s) == (
        pytest.approx(0.04),
        pytest.approx(0.2),
    )


def test_a_restarted_streaming_instance_counts_from_zero() -> None:
    def pod(i0: StreamCounts, i1: StreamCounts) -> RouterCounters:
        return RouterCounters(streams={"i0": i0, "i1": i1})

    history = CounterHistory()
    history.add(0.0, pod(StreamCounts(50, 5.0, 20.0), StreamCounts(2, 1.0, 2.0)))
    # i1 restarted and has streamed 5 since, more than before its restart: its count alone
    # looks like 3 more, its times like a reset. Each instance's three go together: 5 streams
    # at 0.1 s to the first token; i0 streamed 5 more at 0.1 s too.
    history.add(10.0, pod(StreamCounts(55, 5.5, 21.0), StreamCounts(5, 0.5, 1.0)))
    window = history.since(10.0, 60.0)
    assert window is not None
    assert window.streams is not None
    assert window.streams.streams == pytest.approx(10)
    assert window.streams.mean_first_s == pytest.approx(0.1)
    assert window.streams.mean_end_s == pytest.approx(0.2)


def test_no_stream_in_the_window_or_no_streaming_router_shows_no_stream_times() -> None:
    plan = policy_compile.compile_policy(_policy_spec(), generation=1).plan
    fast_key = plan.thresholds[0].profile.key
    idle = CounterHistory()
    idle.add(0.0, _streaming(5, 0.2, 1.0))
    idle.add(30.0, _streaming(5, 0.2, 1.0))
    quiet = idle.since(30.0, 60.0)
    assert quiet is not None
    assert quiet.streams is not None
    assert quiet.streams.mean_first_s is None  # the router streams, but streamed nothing
    # A router without the stream counters: streams None, and status.served as it always was.
    plain = CounterHistory()
    plain.add(0.0, _counters(0))
    plain.add(30.0, _counters(3))
    counts = plain.since(30.0, 60.0)
    assert counts is not None
    assert counts.streams is None
    for window in (quiet, counts):
        shown = policy_status.served_status(window, plan, 1_800_000_000.0)
        assert "ttftMeanMs" not in shown
        assert "streamMeanMs" not in shown
    streamed = ServedCounts({fast_key: 4.0}, 0.0, 60.0, StreamCounts(4, 4 * 0.0421, 4 * 0.25))
    shown = policy_status.served_status(streamed, plan, 1_800_000_000.0)
    assert (shown["ttftMeanMs"], shown["streamMeanMs"]) == (42.1, 250.0)
    ParetoPolicyStatus.model_validate({"served": shown})  # what the CRD's schema admits


def test_pods_stream_times_add_up_as_streams() -> None:
    a = ServedCounts({FAST: 2.0}, streams=StreamCounts(2, 0.2, 1.0))
    b = ServedCounts({FAST: 8.0}, streams=StreamCounts(8, 1.6, 4.0))
    total = summed([a, b, ServedCounts({SLOW: 1.0})])  # a non-streaming router's pod too
    assert total is not None
    assert total.streams is not None
    assert total.streams.mean_first_s == pytest.approx(1.8 / 10)
    assert total.streams.mean_end_s == pytest.approx(0.5)


def test_the_gauges_show_the_stream_times_and_go_with_them() -> None:
    metrics = OperatorMetrics()
    labels = {"namespace": "ns", "policy": "p"}
    sample = metrics.registry.get_sample_value
    gauges = with_stream_times(
        PolicyGauges(ready=True), {"ttftMeanMs": 42.0, "streamMeanMs": 250.0}
    )
    metrics.set_policy("ns", "p", "uid", gauges)
    assert sample("compass_served_ttft_seconds", labels) == pytest.approx(0.042)
    assert sample("compass_served_stream_seconds", labels) == pytest.approx(0.25)
    # The routers stopped streaming (status.served without them): the series go.
    metrics.set_policy("ns", "p", "uid", with_stream_times(gauges, {"requests": 3}))
    assert sample("compass_served_ttft_seconds", labels) is None
    assert sample("compass_served_stream_seconds", labels) is None
    metrics.set_policy("ns", "p", "uid", gauges)
    metrics.forget_policy("ns", "p", "uid")
    assert sample("compass_served_ttft_seconds", labels) is None


def _stream_lines(instance: str, streams: float | str, first: float, end: float) -> list[str]:
    """A streaming router instance's stream counters as Triton's exposition writes them."""
    labels = f'{{model="router",instance="{instance}"}}'
    return [
        f"{STREAMS_METRIC}{labels} {streams}",
        f"{STREAM_FIRST_METRIC}{labels} {first}",
        f"{STREAM_END_METRIC}{labels} {end}",
    ]


def test_a_scrape_reads_a_streaming_routers_times(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("compass.dataplane.metrics.time.monotonic", lambda: clock[0])
    page: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write("\n".join(page).encode())

    head = [
        'nv_inference_pending_request_count{model="router",version="1"} 0',
        'compass_router_refused_total{model="router",instance="router_0"} 0',
    ]
    with serve_http(Handler) as address:
        source = TritonQueueDepth(f"http://{address}/metrics", "router")
        page[:] = [*head, *_stream_lines("router_0", 10, 1.0, 5.0)]
        page += _stream_lines("router_1", 0, 0.0, 0.0)
        source.read()
        clock[0] += 10.0
        # router_0: 4 streams at 50 ms to the first token; router_1: 1 at 100 ms. Another
        # model's streams are not counted.
        page[:] = [*head, *_stream_lines("router_0", 14, 1.2, 5.8)]
        page += _stream_lines("router_1", 1, 0.1, 0.3)
        page.append(f'{STREAMS_METRIC}{{model="other",instance="x"}} 99')
        source.read()
        window = source.served(60.0)
        assert window is not None
        assert window.streams is not None
        assert window.streams.streams == 5
        assert window.streams.mean_first_s == pytest.approx(0.3 / 5)
        assert window.streams.mean_end_s == pytest.approx(1.1 / 5)
        # An unreadable stream counter costs the view (logged), never the queue's reading.
        page[:] = [*head, *_stream_lines("router_0", "bad", 1.3, 6.0)]
        clock[0] += 10.0
        assert source.read().queue_depth == 0.0
        assert source.served(60.0) == window

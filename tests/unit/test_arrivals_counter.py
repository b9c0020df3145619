"""The arrivals counter read from Triton's /metrics (finished + pending) never goes down while the
server runs, so the policy's rate evidence and the fleet's per-pod total survive the moment a
request is taken up before the last one's success is counted; a restart still reads as a reset.
A real Triton shows that moment only by chance, so the pod here is a loopback stand-in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from compass.dataplane.fleet import Endpoint, FleetQueueDepth
from compass.dataplane.metrics import TritonQueueDepth
from compass_dev.processes import QuietHandler, serve_http


class Pod:
    """A Triton /metrics stand-in whose counters the test sets between scrapes."""

    def __init__(self) -> None:
        self.success = 0
        self.pending = 0

    def body(self) -> str:
        """The three router series, as Triton exports them."""
        return "\n".join(
            [
                f'nv_inference_request_success{{model="router",version="1"}} {self.success}',
                'nv_inference_request_failure{model="router",version="1"} 0',
                f'nv_inference_pending_request_count{{model="router",version="1"}} {self.pending}',
            ]
        )


@pytest.fixture
def pods() -> Iterator[list[tuple[Pod, str]]]:
    """Two stand-in pods and their metrics URLs."""
    with contextlib.ExitStack() as servers:
        served = []
        for _ in range(2):
            pod = Pod()

            class Handler(QuietHandler):
                def do_GET(self, pod: Pod = pod) -> None:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(pod.body().encode())

            served.append((pod, f"http://{servers.enter_context(serve_http(Handler))}/metrics"))
        yield served


def test_a_request_taken_up_early_does_not_lower_the_counter(
    pods: list[tuple[Pod, str]],
) -> None:
    """finished + pending dips by the request in service; the counter holds, then moves on."""
    pod, url = pods[0]
    source = TritonQueueDepth(url)
    pod.success, pod.pending = 200, 5
    assert source.read().arrivals_total == 205
    pod.pending = 4  # the next request is in service, the last one's success not yet counted
    assert source.read().arrivals_total == 205
    pod.success, pod.pending = 201, 6  # counted, and two more arrived
    assert source.read().arrivals_total == 207


def test_a_restart_still_reads_as_a_reset(pods: list[tuple[Pod, str]]) -> None:
    """Only a restart lowers the finished count: then the counter starts again from zero."""
    pod, url = pods[0]
    source = TritonQueueDepth(url)
    pod.success, pod.pending = 200, 5
    source.read()
    pod.success, pod.pending = 3, 1
    assert source.read().arrivals_total == 4


def test_the_fleet_counts_only_new_arrivals_through_the_dip(pods: list[tuple[Pod, str]]) -> None:
    """Without the hold, the dip read as a restart added the pod's whole history (~200)."""
    endpoints = [
        Endpoint(f"pod{i}", "127.0.0.1:1", metrics_url=url) for i, (_, url) in enumerate(pods)
    ]
    source = FleetQueueDepth(lambda: endpoints)
    for pod, _ in pods:
        pod.success, pod.pending = 200, 0
    first = source.read().arrivals_total
    busy = pods[0][0]
    busy.pending = 10
    source.read()
    busy.success, busy.pending = 200, 9  # one taken up, its success not yet counted
    source.read()
    busy.success, busy.pending = 210, 0
    last = source.read().arrivals_total
    assert first is not None
    assert last is not None
    assert last - first == pytest.approx(5)  # ten arrivals over two pods
    # A pod that restarts has everything it shows counted as new, as before.
    pods[1][0].success, pods[1][0].pending = 4, 0
    restarted = source.read().arrivals_total
    assert restarted is not None
    assert restarted - last == pytest.approx(2)


def _one_pod_fleet(url: str) -> FleetQueueDepth:
    return FleetQueueDepth(lambda: [Endpoint("pod0", "127.0.0.1:1", metrics_url=url)])


def test_a_counter_read_a_little_lower_once_is_no_restart(pods: list[tuple[Pod, str]]) -> None:
    """Scrapes out of order under load: one reading ~200 below the last. Taken for a restart, the
    pod's whole count (~800) was added and the forecast rate jumped; it is held instead."""
    pod, url = pods[0]
    source = _one_pod_fleet(url)
    pod.success = 1000
    first = source.read().arrivals_total
    pod.success = 800  # an older scrape answered last
    assert source.read().arrivals_total == first
    pod.success = 1010
    last = source.read().arrivals_total
    assert first is not None
    assert last is not None
    assert last - first == pytest.approx(10)


def test_a_restart_the_pod_got_busy_after_is_counted_on_the_second_low_reading(
    pods: list[tuple[Pod, str]],
) -> None:
    """A restarted pod that already served more than half its old count reads low twice in a
    row (a reordered scrape reads low once): then what it shows counts as new."""
    pod, url = pods[0]
    source = _one_pod_fleet(url)
    pod.success = 1000
    first = source.read().arrivals_total
    pod.success = 700
    assert source.read().arrivals_total == first
    pod.success = 750
    after = source.read().arrivals_total
    assert first is not None
    assert after is not None
    assert after - first == pytest.approx(750)
    pod.success = 760
    later = source.read().arrivals_total
    assert later is not None
    assert later - after == pytest.approx(10)


def test_a_counter_far_below_is_a_restart_at_once(pods: list[tuple[Pod, str]]) -> None:
    pod, url = pods[0]
    source = _one_pod_fleet(url)
    pod.success = 1000
    first = source.read().arrivals_total
    pod.success = 30
    after = source.read().arrivals_total
    assert first is not None
    assert after is not None
    assert after - first == pytest.approx(30)

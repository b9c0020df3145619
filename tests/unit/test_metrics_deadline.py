"""A metrics endpoint that trickles its answer cannot hold a policy's thread: every outbound
HTTP read has one deadline for the whole request (connect, headers, body), not a timeout per
socket read. The endpoints are real servers on loopback that send a byte at a time, each well
within any per-read timeout."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from compass.dataplane.fleet import Endpoint, FleetQueueDepth
from compass.dataplane.metrics import (
    MetricsUnavailableError,
    PrometheusQueueDepth,
    TritonQueueDepth,
)

# The drip: one byte this often, far below the per-read timeout the sources are given.
DRIP_S = 0.05
DEADLINE_S = 0.5
# A read that is not back by then is blocked (the drip alone would last hours).
GIVE_UP_S = 5.0

BODY_DRIP = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n"
HEADER_DRIP = b"HTTP/1.1 200 OK\r\nX-Slow: "  # then one header byte at a time, never a CRLF


@contextlib.contextmanager
def drip_server(head: bytes) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that sends ``head`` and then one byte every DRIP_S, for
    every connection, until the test ends; gives its base URL."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)

    def trickle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)  # the request
                conn.sendall(head)
                while not stop.wait(DRIP_S):
                    conn.sendall(b"x")
            except OSError:
                return  # the client hung up: what the deadline is for

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def _outcome(read: Callable[[], object]) -> tuple[BaseException | object, float]:
    """What ``read`` returned or raised, and how long it took; fails if it is still blocked
    after GIVE_UP_S (the thread is left to end when the server stops)."""
    box: list[BaseException | object] = []

    def run() -> None:
        try:
            box.append(read())
        except BaseException as error:
            box.append(error)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GIVE_UP_S)
    assert not thread.is_alive(), f"the read was still blocked after {GIVE_UP_S} s"
    return box[0], time.monotonic() - started


@pytest.mark.parametrize("head", [BODY_DRIP, HEADER_DRIP], ids=["body", "headers"])
def test_a_trickled_metrics_page_fails_within_the_deadline(head: bytes) -> None:
    with drip_server(head) as base:
        source = TritonQueueDepth(f"{base}/metrics", timeout_s=DEADLINE_S)
        error, took = _outcome(source.read)
    assert isinstance(error, MetricsUnavailableError), error
    assert "within 0.5 s" in str(error)
    assert took < DEADLINE_S + 1.0


@pytest.mark.parametrize("head", [BODY_DRIP, HEADER_DRIP], ids=["body", "headers"])
def test_a_trickled_prometheus_answer_fails_within_the_deadline(head: bytes) -> None:
    with drip_server(head) as base:
        source = PrometheusQueueDepth(base, timeout_s=DEADLINE_S)
        error, took = _outcome(source.read)
    assert isinstance(error, MetricsUnavailableError), error
    assert "within 0.5 s" in str(error)
    assert took < DEADLINE_S + 1.0


def test_one_trickling_pod_costs_the_fleet_one_deadline_not_its_reading() -> None:
    """The per-pod scrape of every pod (FleetQueueDepth): a dripping pod is left out after the
    deadline, the others' reading stands."""
    page = b'nv_inference_pending_request_count{model="r"} 3\n'
    healthy = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)
    with drip_server(BODY_DRIP) as slow, drip_server(healthy) as good:
        fleet = FleetQueueDepth(
            lambda: [
                Endpoint("slow", "unused:1", f"{slow}/metrics"),
                Endpoint("good", "unused:1", f"{good}/metrics"),
            ],
            model="r",
            timeout_s=DEADLINE_S,
        )
        reading, took = _outcome(fleet.read)
    assert not isinstance(reading, BaseException), reading
    assert getattr(reading, "queue_depth", None) == 3.0
    assert getattr(reading, "pods", None) == 1
    assert took < DEADLINE_S + 1.0

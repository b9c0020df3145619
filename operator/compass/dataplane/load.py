"""Open-loop load against the router: requests leave at their times, whatever the replies."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.dataplane.triton import (
    LATE_MESSAGE,
    GrpcTls,
    grpc_client,
    read_reply,
    request_tensor,
)
from compass_rules.deadlines import DEADLINE_PARAMETER


@dataclass(frozen=True)
class RequestRecord:
    """One request: when it was sent (s from the start), how long it took, who served it."""

    sent_s: float
    latency_s: float
    config: str | None
    score: float | None
    error: str | None

    @property
    def refused(self) -> bool:
        """Refused by admission as late (retryable), not failed."""
        return self.error is not None and LATE_MESSAGE in self.error


def run_load(
    url: str | Sequence[str],
    arrivals: Sequence[float],
    payload: Callable[[int], dict[str, Any]],
    model: str = DEFAULT_ROUTER_MODEL,
    timeout_s: float = 120.0,
    on_reply: Callable[[RequestRecord], None] | None = None,
    replicas: Sequence[int] | None = None,
    parameters: Mapping[str, str] | None = None,
    deadline_s: float | None = None,
    queue_timeout_s: float | None = None,
    tls: GrpcTls | None = None,
) -> list[RequestRecord]:
    """Send request i at ``arrivals[i]`` s to ``url[replicas[i]]``; every reply, when all came."""
    if queue_timeout_s is not None and not queue_timeout_s > 0:
        raise ValueError(f"queue_timeout_s: {queue_timeout_s!r} is not > 0; give seconds, or None")
    # Triton takes the timeout in whole microseconds; 0 would mean none.
    timeout_us = None if queue_timeout_s is None else max(round(queue_timeout_s * 1e6), 1)
    urls = [url] if isinstance(url, str) else list(url)
    if replicas is None:
        replicas = [0] * len(arrivals)
    if len(replicas) != len(arrivals) or any(not 0 <= r < len(urls) for r in replicas):
        raise ValueError(f"replicas: one index in [0, {len(urls)}) per arrival")
    clients = [grpc_client(u, tls) for u in urls]
    records: list[RequestRecord | None] = [None] * len(arrivals)
    done = threading.Semaphore(0)
    start = time.perf_counter()

    def send(index: int) -> None:
        tensor = request_tensor(payload(index))
        extra: dict[str, Any] = dict(parameters or {})
        if deadline_s is not None:
            extra[DEADLINE_PARAMETER] = time.time_ns() + round(deadline_s * 1e9)
        sent = time.perf_counter()

        def callback(result: Any, error: Any) -> None:
            latency = time.perf_counter() - sent
            if error is not None:
                record = RequestRecord(sent - start, latency, None, None, str(error))
            else:
                body, served_by = read_reply(result)
                score = None if body.get("score") is None else float(body["score"])
                record = RequestRecord(sent - start, latency, served_by, score, None)
            records[index] = record
            if on_reply is not None:
                on_reply(record)
            done.release()

        client = clients[replicas[index]]
        client.async_infer(
            model,
            [tensor],
            callback,
            client_timeout=timeout_s,
            parameters=extra or None,
            timeout=timeout_us,
        )

    try:
        for index, at in enumerate(arrivals):
            delay = at - (time.perf_counter() - start)
            if delay > 0:
                time.sleep(delay)
            send(index)
        for _ in arrivals:
            done.acquire()
    finally:
        for client in clients:
            client.close()
    return [r for r in records if r is not None]

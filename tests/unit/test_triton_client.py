"""What the Triton client reads from the router: component times ({model: ms}, or a clear
error), how many requests it serves at once (its instance groups), and a stream's timing."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from compass.dataplane.triton import (
    FINAL_RESPONSE_PARAMETER,
    RoutingError,
    TritonRouter,
    component_times_of,
    router_instances,
)
from compass.domain.space import config_key


def test_component_times_are_read_as_floats_by_model() -> None:
    assert component_times_of({"retriever": 3, "generator": 41.5}, "pod:8001") == {
        "retriever": 3.0,
        "generator": 41.5,
    }


@pytest.mark.parametrize("times", [[1.0, 2.0], {"generator": "41"}, {"generator": True}, None])
def test_anything_else_is_refused_naming_the_server_and_the_key(times: object) -> None:
    with pytest.raises(RoutingError, match=r"pod:8001: compass_component_ms is not \{model: ms\}"):
        component_times_of(times, "pod:8001")


def test_the_routers_instances_add_up_its_instance_groups() -> None:
    assert router_instances({"instance_group": [{"count": 4, "kind": "KIND_CPU"}]}) == 4
    assert router_instances({"instance_group": [{"count": 2}, {"kind": "KIND_CPU"}]}) == 3
    assert router_instances({}) == 1


class _Final:
    """The parameter Triton sets on a stream's last (empty) response."""

    bool_param = True


class _Response:
    """A streamed response: a token, or the final one; its outputs the router's two tensors."""

    def __init__(self, final: bool) -> None:
        self.parameters = {FINAL_RESPONSE_PARAMETER: _Final()} if final else {}

    def get_response(self) -> _Response:
        return self

    def as_numpy(self, name: str) -> np.ndarray:
        value = '{"answer": "t0"}' if name == "RESULT" else config_key({"model": "small"})
        return np.array([value.encode()], dtype=np.object_)


class _SlowToCloseStream:
    """A stream client that answers at once and then takes CLOSE_S to close the stream, as a
    busy client's gRPC stream can: no request spends that time (the real server cannot be made
    slow to close on demand)."""

    CLOSE_S = 0.5

    def start_stream(self, callback: Any, stream_timeout: float) -> None:
        self.callback = callback

    def async_stream_infer(self, *_: Any, **__: Any) -> None:
        self.callback(_Response(final=False), None)
        self.callback(_Response(final=True), None)

    def stop_stream(self) -> None:
        time.sleep(self.CLOSE_S)

    def close(self) -> None:
        pass


def test_a_streams_latency_ends_at_its_final_response_not_at_the_streams_close() -> None:
    router = TritonRouter("127.0.0.1:1")
    router._decoupled = True
    router._streams.client = _SlowToCloseStream()
    try:
        reply = router.infer({"sample": 0})
    finally:
        router.close()
    assert reply.first_response_s is not None
    assert reply.first_response_s <= reply.latency_s < _SlowToCloseStream.CLOSE_S / 2
    assert reply.streamed == ({"answer": "t0"},)

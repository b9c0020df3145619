"""The router's component times as the client reads them: {model: ms}, or a clear error."""

from __future__ import annotations

import pytest

from compass.dataplane.triton import RoutingError, component_times_of


def test_component_times_are_read_as_floats_by_model() -> None:
    assert component_times_of({"retriever": 3, "generator": 41.5}, "pod:8001") == {
        "retriever": 3.0,
        "generator": 41.5,
    }


@pytest.mark.parametrize("times", [[1.0, 2.0], {"generator": "41"}, {"generator": True}, None])
def test_anything_else_is_refused_naming_the_server_and_the_key(times: object) -> None:
    with pytest.raises(RoutingError, match=r"pod:8001: compass_component_ms is not \{model: ms\}"):
        component_times_of(times, "pod:8001")

"""The router's gate (model-images/router/compass_router/gate.py, ``compass_pipeline_slots``) across real
processes: requests pass in arrival order, no more than the slots at once, the one that passes
sees the waiters' deadlines, and a process that died at the gate or in the pipeline never
wedges it. (A real tritonserver runs it in tests/triton/test_router_pipeline_gate.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compass_dev.router_module import router_part
from compass_rules.binding import bind_stage, check_binding
from compass_rules.followers import follower_slacks_ms, slacks_behind_ms


@pytest.fixture(scope="module")
def router() -> types.ModuleType:
    """The router's gate module."""
    return router_part("gate")


def _in_child(path: str, passes: bool, deadline_ns: int | None) -> tuple[int, int]:
    """A process (its pid, and the read end of a pipe it writes to once at the gate) that
    queues at the gate of the table at ``path`` with ``deadline_ns``, passes it if ``passes``,
    then waits to die."""
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready)
            gate = router_part("gate").Inflight(path)
            gate.queue_at_gate(deadline_ns)
            if passes:
                gate.pass_gate(1)
            os.write(told, b"x")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(told)
    return pid, ready


@pytest.fixture
def children() -> Iterator[list[int]]:
    """Child processes the test started, killed and reaped at the end if still there."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _start(path: str, passes: bool, children: list[int], deadline_ns: int | None = None) -> int:
    pid, ready = _in_child(path, passes, deadline_ns)
    children.append(pid)
    assert os.read(ready, 1) == b"x"
    os.close(ready)
    return pid


@pytest.mark.parametrize("passed", [True, False], ids=["in-the-pipeline", "waiting"])
def test_a_process_that_died_at_the_gate_does_not_wedge_it(
    router: types.ModuleType, tmp_path: Path, children: list[int], passed: bool
) -> None:
    path = str(tmp_path / "inflight.bin")
    pid = _start(path, passed, children)
    gate = router.Inflight(path)
    gate.queue_at_gate(time.time_ns() + 10**9)
    # Alive, it is ahead: nothing clears it.
    assert len(gate.ahead_at_gate()) == 1
    gate.clear_gone(gate.ahead_at_gate())
    assert len(gate.ahead_at_gate()) == 1
    os.kill(pid, signal.SIGKILL)  # not reaped yet: a zombie serves nothing either
    started = time.monotonic()
    gate.pass_gate(1, check_s=0.02)
    assert time.monotonic() - started < 1.0
    assert len(gate.ahead_at_gate()) == 0


def test_a_slot_claimed_again_starts_free_at_the_gate(
    router: types.ModuleType, tmp_path: Path, children: list[int]
) -> None:
    # A stub restarted after a crash takes the dead one's slot: its old place at the gate goes.
    path = str(tmp_path / "inflight.bin")
    pid = _start(path, True, children)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    children.remove(pid)
    restarted = router.Inflight(path)
    assert int(restarted.gate_slots[restarted.slot, 2]) == router.GATE_FREE
    later = router.Inflight(path)
    later.queue_at_gate(None)
    assert len(later.ahead_at_gate()) == 0


def test_a_request_enters_at_once_only_where_the_gate_has_room(
    router: types.ModuleType, tmp_path: Path, children: list[int]
) -> None:
    # enter_if_free: the router sets its gate gauge only for a request that has to wait.
    path = str(tmp_path / "inflight.bin")
    gate = router.Inflight(path)
    gate.queue_at_gate(None)
    assert gate.enter_if_free(1)
    assert int(gate.gate_slots[gate.slot, 2]) == router.GATE_RUNNING
    gate.leave_gate()
    _start(path, True, children)  # another process in the pipeline
    gate.queue_at_gate(None)
    assert not gate.enter_if_free(1)
    assert int(gate.gate_slots[gate.slot, 2]) == router.GATE_WAITING
    assert gate.enter_if_free(2)
    assert int(gate.gate_slots[gate.slot, 2]) == router.GATE_RUNNING


def test_waiters_queue_in_arrival_order_seen_with_their_deadlines_by_the_one_ahead(
    router: types.ModuleType, tmp_path: Path, children: list[int]
) -> None:
    path = str(tmp_path / "inflight.bin")
    first = router.Inflight(path)
    first.queue_at_gate(time.time_ns() + 10**9)
    first.pass_gate(1)
    # Three processes wait behind it, in the order they came, two with deadlines.
    deadlines = [time.time_ns() + 2 * 10**9, time.time_ns() + 10**9]
    _start(path, False, children, deadlines[0])
    _start(path, False, children, deadlines[1])
    _start(path, False, children, None)
    # With when each was queued: what the request ahead counts them by (an ordinary deadline).
    queued = first.gate_followers()
    assert [d for d, _ in queued] == [*deadlines, 0]
    assert all(deadlines[1] - 10**9 - 60 * 10**9 < q <= time.time_ns() for _, q in queued)
    # One more here would be behind all four; the first gone, behind three.
    first.leave_gate()
    first.queue_at_gate(None)
    assert len(first.ahead_at_gate()) == 3
    assert first.gate_followers() == []


def test_the_gates_followers_are_spared_with_their_own_deadlines(
    router: types.ModuleType,
) -> None:
    # One follower with 900 ms left behind a request whose fastest takes 300 ms, the follower
    # 300 ms: it has 300 ms spare. Counted by the poller instead, it would be taken as having
    # the request's own 2,000 ms: no constraint at all.
    table: dict[str, Any] = check_binding(
        {
            "stages": [["a"]],
            "components": ["m"],
            "configs": [
                {"config": '{"a": 0}', "accuracy": 0.8, "stage_ms": [300.0]},
                {"config": '{"a": 1}', "accuracy": 0.9, "stage_ms": [900.0]},
            ],
        }
    )
    [seen] = slacks_behind_ms(table, {}, 0, [0.0], [900.0], 1)
    assert [seen] == pytest.approx(follower_slacks_ms(300.0, [900.0], 300.0))
    assert seen == pytest.approx(300.0)
    assert bind_stage(table, 0, {}, 2000.0, [0.0], spare_ms=seen)[0] == 0
    [polled] = slacks_behind_ms(table, {}, 0, [0.0], [2000.0], 1)
    assert bind_stage(table, 0, {}, 2000.0, [0.0], spare_ms=polled)[0] == 1
    assert slacks_behind_ms(table, {}, 0, [0.0], [], 1) == []

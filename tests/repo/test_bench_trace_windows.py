"""bench/trace_windows.py deals each trace's slots into tuning and held-out windows, seeded."""

from __future__ import annotations

import itertools

import pytest
from bench_runner import bench_module

from compass.domain.traces import TRACE_NAMES, TRACE_SPANS, TraceError, stretch_window
from compass.examples import load_trace

trace_windows = bench_module("trace_windows").trace_windows


def test_trace_windows_same_seed_same_windows_other_seed_other_windows() -> None:
    first = trace_windows(TRACE_NAMES, 4, 300.0, seed=7)
    assert first == trace_windows(TRACE_NAMES, 4, 300.0, seed=7)
    others = [trace_windows(TRACE_NAMES, 4, 300.0, seed=s) for s in range(8, 12)]
    assert all(o != first for o in others)
    assert len({o.tuning for o in others} | {first.tuning}) == 5


def test_trace_windows_sets_are_disjoint_balanced_aligned_and_inside() -> None:
    sets = trace_windows(TRACE_NAMES, 5, 300.0, seed=1)
    assert len(sets.tuning) == 3 * len(TRACE_NAMES)
    assert len(sets.held_out) == 2 * len(TRACE_NAMES)
    for name in TRACE_NAMES:
        mine = [w for w in sets.tuning + sets.held_out if w.trace == name]
        # Non-overlapping slots [j L, (j + 1) L): distinct starts, whole multiples of L.
        starts = sorted(w.start_s for w in mine)
        assert all(s % 300.0 == 0 for s in starts)
        assert all(b - a >= 300.0 for a, b in itertools.pairwise(starts))
        assert starts[-1] + 300.0 <= TRACE_SPANS[name]
        assert any(w.trace == name for w in sets.held_out)
    assert not set(sets.tuning) & set(sets.held_out)
    # Every window cuts and stretches without error.
    for window in sets.tuning + sets.held_out:
        assert len(stretch_window(load_trace(window.trace), window, 0.7, 3.0)) > 0


def test_a_traces_windows_do_not_depend_on_which_other_traces_are_asked_for() -> None:
    alone = trace_windows(["azure-llm-code-2023"], 4, 300.0, seed=2)
    together = trace_windows(list(reversed(TRACE_NAMES)), 4, 300.0, seed=2)
    assert alone.tuning == tuple(w for w in together.tuning if w.trace == "azure-llm-code-2023")
    assert alone.held_out == tuple(w for w in together.held_out if w.trace == "azure-llm-code-2023")


def test_trace_windows_uses_every_slot_when_asked_for_all() -> None:
    sets = trace_windows(["t"], 6, 10.0, seed=0, spans={"t": 60.0})
    assert sorted(w.start_s for w in sets.tuning + sets.held_out) == [0, 10, 20, 30, 40, 50]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: trace_windows(TRACE_NAMES, 12, 300.0, 0), r"^count: .* holds 11 windows"),
        (lambda: trace_windows(TRACE_NAMES, 1, 300.0, 0), r"^count: 1 is not >= 2"),
        (lambda: trace_windows(["nope"], 2, 300.0, 0), r"^trace: no trace named 'nope'; use"),
        (lambda: trace_windows([], 2, 300.0, 0), r"^names: no trace named"),
        (lambda: trace_windows("azure-llm-code-2023", 2, 300.0, 0), r"^names: "),
        (lambda: trace_windows(TRACE_NAMES * 2, 2, 300.0, 0), r"^names: .* twice"),
        (lambda: trace_windows(TRACE_NAMES, 2, float("nan"), 0), r"^length_s: nan is not"),
        (lambda: trace_windows(TRACE_NAMES, 2, -5.0, 0), r"^length_s: -5 is not a finite"),
        (lambda: trace_windows(TRACE_NAMES, 2, 300.0, -1), r"^seed: -1 is not >= 0"),
        (lambda: trace_windows(TRACE_NAMES, 2.5, 300.0, 0), r"^count: 2.5 is not a whole"),  # type: ignore[arg-type]
    ],
)
def test_bad_window_requests_name_the_field_and_the_fix(call: object, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        call()  # type: ignore[operator]

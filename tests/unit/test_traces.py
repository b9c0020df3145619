"""The shipped production traces and the window cut, stretch and enumeration the benches share."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import math
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from compass.domain.arrivals import PatternKind, make_pattern, make_scenario
from compass.domain.traces import (
    TRACE_NAMES,
    TRACE_SPANS,
    TraceError,
    TraceWindow,
    cut_window,
    kth_window,
    random_window,
    stretch_window,
    trace_windows,
)
from compass.examples import load_trace, shipped_traces

TRACES_DIR = Path(__file__).resolve().parents[2] / "operator" / "compass" / "examples" / "traces"
README = (TRACES_DIR / "README.md").read_text(encoding="utf-8")


def readme_sha256(file_name: str) -> str:
    """The SHA-256 the README's checksum table gives for this trimmed file."""
    found = re.findall(rf"\| trimmed `{re.escape(file_name)}` \| `([0-9a-f]{{64}})` \|", README)
    assert len(found) == 1, f"README lists {file_name}'s SHA-256 {len(found)} times"
    return str(found[0])


def readme_rows(name: str) -> int:
    """The row count in the README's summary table for this trace."""
    found = re.findall(rf"^\| `{re.escape(name)}` \|[^|]*\|[^|]*\| ([\d,]+) \|", README, re.M)
    assert len(found) == 1, f"README's table lists {name} {len(found)} times"
    return int(found[0].replace(",", ""))


def cv(values: npt.NDArray[np.float64]) -> float:
    return float(np.std(values) / np.mean(values))


def test_the_shipped_traces_are_the_ones_the_domain_names() -> None:
    assert shipped_traces() == tuple(sorted(TRACE_NAMES))
    assert len(TRACE_NAMES) >= 3


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_shipped_file_matches_its_readme_checksum(name: str) -> None:
    data = (TRACES_DIR / f"{name}.txt.gz").read_bytes()
    assert hashlib.sha256(data).hexdigest() == readme_sha256(f"{name}.txt.gz")
    # Gzip written with mtime 0 (bytes 4-7), as hack/trim_traces.py promises: reproducible.
    assert data[4:8] == b"\0\0\0\0"
    assert len(data) < 300_000


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_shipped_trace_loads_sorted_finite_from_zero_with_every_row(name: str) -> None:
    times = load_trace(name)
    assert times.dtype == np.float64
    assert len(times) == readme_rows(name)
    assert np.all(np.isfinite(times))
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    assert math.isclose(float(times[-1]), TRACE_SPANS[name], abs_tol=1e-9)
    # Several hours is not on offer from these sources; at least most of an hour is.
    assert times[-1] > 3000
    # One plain number a line: the format `--trace FILE` reads once decompressed.
    text = gzip.decompress((TRACES_DIR / f"{name}.txt.gz").read_bytes()).decode("ascii")
    assert text.endswith("\n")
    assert len(text.splitlines()) == len(times)


def test_load_trace_names_the_choices_for_an_unknown_trace() -> None:
    with pytest.raises(ValueError, match="no shipped trace named 'nope'; use one of: azure-llm"):
        load_trace("nope")


@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize(("utilisation", "capacity"), [(0.5, 2.0), (0.9, 40.0), (0.7, 0.3)])
def test_stretch_hits_the_target_mean_rate_and_keeps_the_shape(
    name: str, utilisation: float, capacity: float
) -> None:
    times = load_trace(name)
    window = TraceWindow(name, 1200.0, 600.0)
    cut = cut_window(times, window)
    stretched = stretch_window(times, window, utilisation, capacity)
    target = utilisation * capacity
    assert math.isclose(stretched.mean_qps, target, rel_tol=1e-12)
    assert math.isclose(len(cut) / stretched.duration_s, target, rel_tol=1e-12)
    assert math.isclose(stretched.factor, (len(cut) / 600.0) / target, rel_tol=1e-12)
    # The same requests, in the same order, every gap scaled by one factor.
    assert len(stretched.arrivals_s) == len(cut)
    assert np.all(np.diff(stretched.arrivals_s) >= 0)
    np.testing.assert_allclose(stretched.arrivals_s, cut * stretched.factor, rtol=1e-12)
    gaps, new_gaps = np.diff(cut), np.diff(stretched.arrivals_s)
    assert math.isclose(cv(new_gaps), cv(gaps), rel_tol=1e-9)
    assert np.array_equal(gaps == 0, new_gaps == 0)
    assert stretched.arrivals_s[-1] < stretched.duration_s


def test_cut_window_takes_exactly_the_half_open_interval() -> None:
    times = np.array([0.0, 1.0, 2.0, 2.0, 3.5, 5.0, 7.0])
    np.testing.assert_array_equal(cut_window(times, TraceWindow("t", 2.0, 3.0)), [0.0, 0.0, 1.5])
    # A real trace: the window holds what the trace has in [start, start + length).
    real = load_trace("azure-llm-conv-2023")
    inside = ((real >= 600.0) & (real < 900.0)).sum()
    assert len(cut_window(real, TraceWindow("azure-llm-conv-2023", 600.0, 300.0))) == inside > 0


def test_a_stretched_window_plugs_into_the_simulators_trace_pattern() -> None:
    times = load_trace("azure-llm-code-2023")
    stretched = stretch_window(times, TraceWindow("azure-llm-code-2023", 0.0, 300.0), 0.8, 2.5)
    pattern = make_pattern("trace", 1, 1, trace_s=stretched.arrivals_s.tolist())
    assert pattern.kind is PatternKind.TRACE
    scenario = make_scenario(pattern, seed=0)
    first = stretched.arrivals_s[0]
    np.testing.assert_allclose(scenario.arrivals_s, stretched.arrivals_s - first)
    # The pattern's own rate runs from the first to the last arrival: a little above the target.
    span = stretched.arrivals_s[-1] - first
    assert pattern.base_qps == pytest.approx(len(stretched.arrivals_s) / span)
    assert 2.0 <= pattern.base_qps < 2.0 * 1.1


def test_stretching_speeds_up_as_well_as_slows_down() -> None:
    times = load_trace("azure-llm-conv-2023")
    window = TraceWindow("azure-llm-conv-2023", 0.0, 600.0)
    assert stretch_window(times, window, 0.5, 1.0).factor > 1  # ~5.5 req/s down to 0.5
    assert stretch_window(times, window, 1.0, 100.0).factor < 1  # up to 100 req/s


def test_kth_window_spaces_starts_evenly_inside_the_trace() -> None:
    span = TRACE_SPANS["mooncake-conversation"]
    starts = [kth_window("mooncake-conversation", k, 5, 600.0).start_s for k in range(5)]
    assert starts[0] == 0.0
    assert starts[-1] == pytest.approx(span - 600.0)
    assert np.allclose(np.diff(starts), (span - 600.0) / 4)
    assert kth_window("mooncake-conversation", 0, 1, 600.0).start_s == 0.0


def test_random_window_is_seeded_and_inside_the_trace() -> None:
    name = "azure-llm-code-2023"
    a, b = random_window(name, 900.0, seed=3), random_window(name, 900.0, seed=3)
    assert a == b
    starts = {random_window(name, 900.0, seed=s).start_s for s in range(20)}
    assert len(starts) == 20
    assert all(0 <= s <= TRACE_SPANS[name] - 900.0 for s in starts)


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
        assert len(stretch_window(load_trace(window.trace), window, 0.7, 3.0).arrivals_s) > 0


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
        (lambda: kth_window("mooncake-conversation", 3, 3, 60.0), r"^k: 3 is not below n = 3"),
        (lambda: kth_window("mooncake-conversation", 0, 2, 1e5), r"^length_s: .* longer than"),
        (lambda: random_window("mooncake-conversation", 1e5, 0), r"^length_s: .* longer than"),
    ],
)
def test_bad_window_requests_name_the_field_and_the_fix(call: object, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("window", "utilisation", "capacity", "message"),
    [
        (TraceWindow("t", 3000.0, 600.0), 0.7, 2.0, r"^start_s: .* ends after .*; start at most"),
        (TraceWindow("t", -1.0, 60.0), 0.7, 2.0, r"^start_s: -1 is not a finite number >= 0"),
        (TraceWindow("t", float("inf"), 60.0), 0.7, 2.0, r"^start_s: inf is not"),
        (TraceWindow("t", 0.0, 0.0), 0.7, 2.0, r"^length_s: 0 is not a finite number > 0"),
        (TraceWindow("t", 0.0, 60.0), 0.0, 2.0, r"^utilisation: 0 is not a finite number > 0"),
        (TraceWindow("t", 0.0, 60.0), 0.7, float("inf"), r"^capacity_qps: inf is not"),
        (TraceWindow("t", 0.0, 60.0), 0.7, -2.0, r"^capacity_qps: -2 is not"),
        (TraceWindow("t", 3100.0, 60.0), 0.7, 2.0, r"^window: it holds no arrival"),
    ],
)
def test_bad_stretch_inputs_name_the_field_and_the_fix(
    window: TraceWindow, utilisation: float, capacity: float, message: str
) -> None:
    times = np.concatenate([np.linspace(0.0, 3000.0, 500), [3500.0]])
    with pytest.raises(TraceError, match=message):
        stretch_window(times, window, utilisation, capacity)


@pytest.mark.parametrize(
    ("arrivals", "message"),
    [
        ([], r"^arrivals: not a non-empty"),
        ([0.0, float("nan"), 2.0], r"^arrivals: an offset is not a finite number"),
        ([0.0, 2.0, 1.0, 3.0], r"^arrivals: offset 3 \(1\) is before the one above it; sort"),
        ([-1.0, 2.0], r"^arrivals: the first offset is -1 < 0"),
    ],
)
def test_bad_arrivals_name_the_problem(arrivals: list[float], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        cut_window(arrivals, TraceWindow("t", 0.0, 1.0))

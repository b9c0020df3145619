"""The shipped production traces and the window cut, stretch and enumeration the benches share."""

from __future__ import annotations

import gzip
import hashlib
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
    stretch_window,
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
    factor = (len(cut) / 600.0) / target
    # The same requests, in the same order, every gap scaled by one factor: over the window's
    # length stretched by it, at the target rate.
    duration = 600.0 * factor
    assert math.isclose(len(stretched) / duration, target, rel_tol=1e-12)
    assert len(stretched) == len(cut)
    assert np.all(np.diff(stretched) >= 0)
    np.testing.assert_allclose(stretched, cut * factor, rtol=1e-12)
    gaps, new_gaps = np.diff(cut), np.diff(stretched)
    assert math.isclose(cv(new_gaps), cv(gaps), rel_tol=1e-9)
    assert np.array_equal(gaps == 0, new_gaps == 0)
    assert stretched[-1] < duration


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
    pattern = make_pattern("trace", 1, 1, trace_s=stretched.tolist())
    assert pattern.kind is PatternKind.TRACE
    scenario = make_scenario(pattern, seed=0)
    first = stretched[0]
    np.testing.assert_allclose(scenario.arrivals_s, stretched - first)
    # The pattern's own rate runs from the first to the last arrival: a little above the target.
    span = stretched[-1] - first
    assert pattern.base_qps == pytest.approx(len(stretched) / span)
    assert 2.0 <= pattern.base_qps < 2.0 * 1.1


def test_stretching_speeds_up_as_well_as_slows_down() -> None:
    times = load_trace("azure-llm-conv-2023")
    window = TraceWindow("azure-llm-conv-2023", 0.0, 600.0)
    cut = cut_window(times, window)
    assert stretch_window(times, window, 0.5, 1.0)[-1] > cut[-1]  # ~5.5 req/s down to 0.5
    assert stretch_window(times, window, 1.0, 100.0)[-1] < cut[-1]  # up to 100 req/s


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

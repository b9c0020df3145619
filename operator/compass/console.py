"""What the command line shows people: one-line usage errors (exit code 2), the search's
progress line, the plan table and the policy file."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Mapping
from typing import Any, NoReturn, TextIO

import yaml

from compass.api.paretopolicy import ParetoPolicySpec
from compass.conversion import planned_manifest
from compass.domain.evaluation import Evaluator
from compass.domain.planner import Plan
from compass.domain.search import ChunkRunner, Progress, SearchOutcome, SearchSettings, search
from compass.domain.space import Space

PROGRESS_INTERVAL_S = 0.1
BAR_WIDTH = 20


class UsageError(Exception):
    """Bad input: a one-line `<field>: <what is wrong>; <the fix>`; exit code 2."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        """`prog` names the (sub)command when argparse itself found the problem."""
        super().__init__(message)
        self.prog = prog


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it cleans up as it does for Ctrl-C."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and leave the exit to main()."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of printing the usage block and exiting."""
        raise UsageError(f"{message}; see '{self.prog} --help'", prog=self.prog)


def fail(field: str, what: str, fix: str) -> NoReturn:
    """Raise the one-line usage error `<field>: <what is wrong>; <the fix>`."""
    raise UsageError(f"{field}: {what}; {fix}")


# A seed is hashed into numpy's generator: 32 bits are plenty, and a bound keeps it one line.
MAX_SEED = 2**32 - 1
# An echoed value longer than this is cut, so that an error stays one readable line.
_SHOWN_CHARACTERS = 40


def shown(text: str, *, quoted: bool = True) -> str:
    """A value as an error message quotes it (repr, or as typed), cut to a readable length."""
    show = repr if quoted else str
    if len(text) <= _SHOWN_CHARACTERS:
        return show(text)
    return f"{show(text[: _SHOWN_CHARACTERS - 10])}... ({len(text):,} characters)"


def parse_number(
    flag: str,
    text: str,
    example: str,
    *,
    low: float,
    inclusive: bool,
    high: float | None = None,
) -> float:
    """A finite float from the command line, above ``low`` (or equal when inclusive), <= high."""
    try:
        value = float(text)
    except ValueError:
        fail(flag, f"{shown(text)} is not a number", f"pass e.g. {flag} {example}")
    if not math.isfinite(value) or value < low or (value == low and not inclusive):
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        fail(flag, f"{shown(text, quoted=False)} is not {bound}", f"pass e.g. {flag} {example}")
    if high is not None and value > high:
        fail(flag, f"{value:g} is above {high:g}", f"pass at most {high:g}, e.g. {flag} {example}")
    return value


def parse_int(
    flag: str, text: str, example: str, *, low: int | None = None, high: int | None = None
) -> int:
    """An integer from the command line, within [low, high] where they are given."""
    digits = text.strip().lstrip("+-")
    if len(digits) > 30 and digits.isdigit():
        # int() would take it (or refuse past 4,300 digits); no flag has a use for it.
        fail(flag, f"{len(digits):,} digits is too large", f"pass e.g. {flag} {example}")
    try:
        value = int(text)
    except ValueError:
        fail(
            flag, f"{shown(text)} is not an integer", f"pass a whole number, e.g. {flag} {example}"
        )
    if low is not None and value < low:
        fail(flag, f"{value} is below {low}", f"pass e.g. {flag} {example}")
    if high is not None and value > high:
        fail(flag, f"{value} is above {high:,}", f"pass at most {high:,}, e.g. {flag} {example}")
    return value


def parse_seed(text: str) -> int:
    """A --seed: an integer in [0, MAX_SEED]."""
    return parse_int("--seed", text, "0", low=0, high=MAX_SEED)


# ---------------------------------------------------------------------------- output


def describe_rate(progress: Progress, elapsed_s: float) -> str:
    """Evaluations per second and an ETA bound: every configuration never evaluated, at the
    samples an evaluated one took so far (COMPASS-V ends before it, often well before)."""
    if elapsed_s <= 0 or progress.sample_evals == 0:
        return "-- eval/s"
    rate = progress.sample_evals / elapsed_s
    per_config = progress.sample_evals / max(progress.configs_evaluated, 1)
    left = (progress.space_size - progress.configs_evaluated) * per_config / rate
    return f"{rate:,.1f} eval/s  ETA <= {_duration(left)}"


def describe_work_rate(done: int, total: int, elapsed_s: float, unit: str = "configs") -> str:
    """What ``done`` of ``total`` in ``elapsed_s`` gives: units per minute and the ETA at that
    rate (the profiling's progress, as describe_rate is the search's)."""
    if elapsed_s <= 0 or done <= 0:
        return f"-- {unit}/min"
    rate = done / elapsed_s
    return f"{rate * 60:,.2f} {unit}/min  ETA {_duration(max(total - done, 0) / rate)}"


def _duration(seconds: float) -> str:
    """A duration as h:mm:ss or m:ss."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressLine:
    """One line on a terminal, redrawn in place after each evaluated batch."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False
        self.last = 0.0
        self.started = time.monotonic()

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        if self.shown and now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        done = progress.configs_evaluated / max(progress.space_size, 1)
        filled = round(done * BAR_WIDTH)
        line = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {progress.phase:<10} "
            f"configs {progress.configs_evaluated}/{progress.space_size}  "
            f"samples {progress.sample_evals:,}  feasible {progress.feasible}  "
            f"{describe_rate(progress, now - self.started)}"
        )
        # A line longer than the terminal wraps, and \r then redraws only its last part.
        width = shutil.get_terminal_size().columns - 1
        self.stream.write("\r\x1b[K" + line[:width])
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """Erase the line so that what follows starts on a clean one."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def search_with_progress(
    space: Space,
    evaluator: Evaluator,
    population: int,
    settings: SearchSettings,
    runner: ChunkRunner | None = None,
) -> SearchOutcome:
    """Run the search with a progress line when stderr is a terminal."""
    progress = ProgressLine(sys.stderr) if sys.stderr.isatty() else None
    try:
        return search(space, evaluator, population, settings, progress=progress, runner=runner)
    finally:
        if progress is not None:
            progress.close()


def _limit(value: int | float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}" if digits else str(value)


def plan_table(plan: Plan) -> str:
    """The front and each member's thresholds, one row each, fastest first."""
    p = f"p{plan.slo.percentile:g}"
    rates = plan.model.with_rates
    # Time to first token, where a streaming router profiled it.
    ttft = any(t.profile.ttft_mean_ms is not None for t in plan.thresholds)
    header = (
        f"  #  {'accuracy':>8}  {'mean ms':>8}  {p + ' ms':>8}  "
        + (f"{'ttft ms':>8}  " if ttft else "")
        + f"{'slack ms':>8}  {'stay<=N':>7}  {'enter<=N':>8}"
        + (f"  {'stay<=qps':>9}  {'enter<=qps':>10}" if rates else "")
        + "  configuration"
    )
    lines = [header]
    for index, t in enumerate(plan.thresholds):
        row = (
            f"{index:>3}  {t.profile.accuracy:>8.4f}  {t.profile.mean_ms:>8.1f}  "
            f"{t.tail_ms:>8.1f}  "
            + (f"{_limit(t.profile.ttft_mean_ms, 1):>8}  " if ttft else "")
            + f"{t.slack_ms:>8.1f}  {_limit(t.stay_max_queue):>7}  "
            f"{_limit(t.enter_max_queue):>8}"
        )
        if rates:
            row += f"  {_limit(t.stay_max_qps, 2):>9}  {_limit(t.enter_max_qps, 2):>10}"
        note = "" if t.eligible else "  (never switched to: slack <= 0)"
        lines.append(f"{row}  {t.profile.name}{note}")
    return "\n".join(lines)


def policy_manifest(
    spec: ParetoPolicySpec, name: str, namespace: str | None = None
) -> dict[str, Any]:
    """An applyable ParetoPolicy of a plan: apiVersion, kind, metadata (name, namespace if
    given) and the spec, camelCase, defaults written out (none a person owns: no paused)."""
    dumped = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return planned_manifest(name, namespace, dumped)


def policy_text(manifest: Mapping[str, Any], form: str) -> str:
    """The manifest as JSON (``form`` "json") or YAML with a header saying how to use it."""
    if form == "json":
        return json.dumps(manifest, indent=2) + "\n"
    header = (
        "# A ParetoPolicy written by `compass plan`: kubectl apply -f this file (or commit it for\n"
        "# GitOps), or pass it to `compass simulate --policy` / `compass serve --policy`.\n"
    )
    return header + yaml.safe_dump(dict(manifest), sort_keys=False, width=100)


def serving_summary(spec: ParetoPolicySpec) -> str:
    """How the policy serves, in a few words."""
    if spec.binding.mode.per_request:
        stages = len(spec.binding.stages)
        what = (
            f"each request bound stage by stage ({stages} stages)"
            if stages
            else "each request bound at take-up"
        )
    else:
        what = f"the whole workflow switched by {spec.strategy.value}"
    if spec.routing is not None and spec.routing.model_rewrite is not None:
        what += ", through the llm-d gateway (each request's model drawn by weight)"
    if spec.routing is not None and spec.routing.http_route is not None:
        what += ", through an HTTPRoute (each request's InferencePool drawn by weight)"
    return what + (", admission on" if spec.admits else "")

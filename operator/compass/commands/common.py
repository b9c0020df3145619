"""What several subcommands share: reading and writing files, the load-pattern flags, policies."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import ValidationError

from compass.api.paretopolicy import ParetoPolicySpec
from compass.api.urls import ENDPOINT_FIX, endpoint_problem
from compass.console import UsageError, fail, parse_number, parse_seed
from compass.domain.admission import DEFAULT_DEGRADE_AFTER, AdmissionPoint
from compass.domain.arrivals import LoadPattern, PatternKind, SimulationError, make_pattern
from compass.domain.planner import PlanError
from compass.domain.space import describe_number, explain_validation_error

# compass.dataplane.triton's default, restated so that building the parser loads no gRPC client.
# Where a planner error's field comes from on the command line.
_PLAN_FLAGS = {"slo.latencyMs": "--slo-ms", "slo.percentile": "--percentile"}


# ---------------------------------------------------------------------------- reading


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader (YAML 1.1), reading 1e-3 as the number YAML 1.2 and JSON make it."""


# YAML 1.1 wants a dot in a float's mantissa, so 1e-3 would load as the string '1e-3'.
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_document(text: str, path: Path | None = None) -> object:
    """A .json file as JSON only; other text as JSON if it is, else YAML (1e-3 a number in both).

    Raises json.JSONDecodeError (a .json file) or yaml.YAMLError.
    """
    if path is not None and path.suffix.lower() == ".json":
        # A .json file that is not JSON is a mistake: YAML would read it with other rules.
        return json.loads(text)
    try:
        return json.loads(text)
    except ValueError:
        return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader subclass: safe


def check_not_input(flag: str, output: Path, inputs: Mapping[str, str | Path | None]) -> None:
    """Fail when the output would overwrite one of the command's input files (symlinks followed)."""
    for input_flag, given in inputs.items():
        if given is not None and Path(given).resolve() == output.resolve():
            fail(flag, f"{output} is also {input_flag}", "write the output to another path")


# Larger integers have no use in any input compass reads, and do not convert to floats.
_MAX_INTEGER = 2**63


def _bad_number(data: object, where: str = "") -> tuple[str, str] | None:
    """The first NaN, infinity or huge integer in a parsed document: (its path, what it is)."""
    if isinstance(data, float) and not math.isfinite(data):
        return where, f"{data} is not a finite number"
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) >= _MAX_INTEGER:
        return where, f"{describe_number(data)} is too large"
    items: Iterable[tuple[object, object]] = ()
    if isinstance(data, Mapping):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    for key, value in items:
        inner = (
            f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        )
        found = _bad_number(value, inner)
        if found is not None:
            return found
    return None


def read_document(flag: str, path: Path) -> object:
    """A parsed YAML or JSON file; any problem is one line naming the flag, the file and where."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(flag, f"{path}: no such file", "check the path")
    except (OSError, UnicodeDecodeError) as exc:
        fail(flag, f"{path}: cannot read it ({exc})", "check the path")
    try:
        data = parse_document(text, path)
    except json.JSONDecodeError as exc:
        where = f"{flag} {path} line {exc.lineno}, column {exc.colno}"
        fail(where, f"not valid JSON ({exc.msg})", "fix the syntax (a .json file is read as JSON)")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        fail(f"{flag} {path}{where}", f"not valid YAML or JSON ({problem})", "fix the syntax")
    except RecursionError:
        fail(f"{flag} {path}", "nested too deeply", "flatten the document")
    bad = _bad_number(data)
    if bad is not None:
        field, what = bad
        fail(f"{flag} {path}: {field or 'the document'}", what, "write a finite number")
    return data


def load_policy(path: Path) -> ParetoPolicySpec:
    """A ParetoPolicy spec body, or a whole ParetoPolicy manifest (its spec is used)."""
    data = read_document("--policy", path)
    prefix = ""
    if isinstance(data, Mapping) and isinstance(data.get("spec"), Mapping):
        data, prefix = data["spec"], "spec."
    if not isinstance(data, Mapping):
        fail(f"--policy {path}", "expected a ParetoPolicy spec (a mapping)", "run `compass plan`")
    try:
        return ParetoPolicySpec.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"--policy {path}: {prefix}{explain_validation_error(exc)}") from None


def plan_error(exc: PlanError, source: str | None = None) -> UsageError:
    """A planner error as a usage error that names the flag (or the file) to fix."""
    flag = _PLAN_FLAGS.get(exc.field) if source is None else None
    where = flag or (exc.field if source is None else f"{source}: {exc.field}")
    return UsageError(f"{where}: {exc.what}; {exc.fix}")


# ---------------------------------------------------------------------------- writing


def check_endpoint(flag: str, address: str) -> None:
    """A --triton HOST:PORT, or the usage error naming the flag (a port past 65535 would wrap)."""
    problem = endpoint_problem(address)
    if problem is not None:
        fail(flag, problem, ENDPOINT_FIX)


def check_output(flag: str, path: Path) -> None:
    """Fail unless path names a file in an existing directory."""
    if path.is_dir():
        fail(flag, f"{path} is a directory", "name a file")
    if not path.parent.is_dir():
        fail(flag, f"directory {path.parent} does not exist", "create it or choose another path")


def write_text(path: Path, text: str) -> None:
    """Write a file; a failure is a usage error naming the path."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(str(path), f"cannot write it ({exc.strerror})", "choose another path")


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory, so readers never see half a file."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes the file private; a result file should get the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


# ---------------------------------------------------------------------------- load patterns


def add_pattern_arguments(parser: argparse.ArgumentParser) -> None:
    """The load-pattern flags `compass simulate` and `compass load` share."""
    add_enum_argument(
        parser,
        "--pattern",
        PatternKind.SPIKE,
        "load shape (default spike: 4x for the middle third)",
    )
    parser.add_argument("--trace", metavar="FILE", help="arrival timestamps (s), one a line")
    parser.add_argument("--duration", default="180", help="seconds of load (default 180)")
    parser.add_argument("--base-qps", default="1.5", help="base arrival rate (default 1.5)")
    parser.add_argument("--seed", default="0", help="seed of the arrivals and service times")


# ---------------------------------------------------------------------------- enum flags


def add_enum_argument(
    parser: argparse.ArgumentParser, flag: str, default: StrEnum, help_text: str
) -> None:
    """A flag whose values are an enum's (e.g. ``--strategy``, ``Strategy.ELASTICO``)."""
    parser.add_argument(
        flag, default=default.value, choices=[m.value for m in type(default)], help=help_text
    )


# ---------------------------------------------------------------------------- admission


def add_admission_arguments(
    parser: argparse.ArgumentParser, default_quantile: str, *, where: bool = True
) -> None:
    """The admission flags `compass simulate` and the benches share: the quantile a request is
    judged on and (``where``) whether at dispatch, as the live routers judge, or at arrival."""
    parser.add_argument(
        "--admission-quantile",
        default=None,
        help="with admission: the quantile of a request's own service time it is judged on "
        f"(default {default_quantile})",
    )
    parser.add_argument(
        "--degrade-after",
        default=None,
        help="with admission: the share of the SLO a request may have waited and still be served "
        f"as routed; past it, on the fastest (default {DEFAULT_DEGRADE_AFTER}; 1: only what would "
        "be late)",
    )
    if where:
        add_enum_argument(
            parser,
            "--admission-at",
            AdmissionPoint.DISPATCH,
            "dispatch (default): judged when a router instance takes it up, on its real wait, "
            "as the live routers do; arrival: on a predicted wait",
        )


def admission_quantile(args: argparse.Namespace, default: float) -> float:
    """--admission-quantile, checked to lie in (0, 1); ``default`` when it is not given."""
    flag = "--admission-quantile"
    if args.admission_quantile is None:
        return default
    quantile = parse_number(flag, str(args.admission_quantile), "0.5", low=0, inclusive=False)
    if quantile >= 1:
        fail(flag, f"{quantile:g} is not < 1", f"pass e.g. {flag} 0.5")
    return quantile


def admission_degrade_after(args: argparse.Namespace, default: float) -> float:
    """--degrade-after, checked to lie in (0, 1]; ``default`` when it is not given."""
    flag = "--degrade-after"
    if args.degrade_after is None:
        return default
    share = parse_number(flag, str(args.degrade_after), "0.25", low=0, inclusive=False)
    if share > 1:
        fail(flag, f"{share:g} is not <= 1", f"pass e.g. {flag} 0.25")
    return share


def read_trace(path: Path) -> list[float]:
    """Arrival times (s) from a file, one a line."""
    try:
        words = path.read_text(encoding="utf-8").split()
    except OSError as exc:
        fail("--trace", f"{path}: cannot read it ({exc.strerror})", "check the path")
    times = []
    for number, word in enumerate(words, start=1):
        try:
            times.append(float(word))
        except ValueError:
            fail(
                "--trace",
                f"{path}: entry {number} ({word!r}) is not a number",
                "one time (s) a line",
            )
    return times


def pattern_from_args(args: argparse.Namespace) -> tuple[LoadPattern, int]:
    """The load pattern and seed the shared flags describe; UsageError names the bad flag."""
    seed = parse_seed(str(args.seed))
    if (args.pattern == PatternKind.TRACE.value) != (args.trace is not None):
        fail("--trace", "--pattern trace and --trace FILE go together", "give both or neither")
    trace: Sequence[float] = () if args.trace is None else read_trace(Path(str(args.trace)))
    duration = parse_number("--duration", str(args.duration), "180", low=0, inclusive=False)
    base = parse_number("--base-qps", str(args.base_qps), "1.5", low=0, inclusive=False)
    try:
        return make_pattern(args.pattern, base, duration, seed=seed, trace_s=trace), seed
    except SimulationError as exc:
        flag = {"base_qps": "--base-qps", "duration": "--duration"}.get(exc.field, "--trace")
        raise UsageError(f"{flag}: {exc.what}; {exc.fix}") from None

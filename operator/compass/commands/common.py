"""What several subcommands share: reading and writing files, the load-pattern flags, policies."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import ValidationError

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.api.paretopolicy import ParetoPolicySpec
from compass.api.urls import ENDPOINT_FIX, endpoint_problem
from compass.console import UsageError, fail, parse_number, parse_seed
from compass.domain.admission import DEFAULT_DEGRADE_AFTER, AdmissionPoint
from compass.domain.arrivals import (
    MAX_REQUESTS,
    LoadPattern,
    PatternKind,
    SimulationError,
    make_pattern,
)
from compass.domain.planner import PlanError
from compass.domain.space import describe_number, explain_validation_error
from compass.domain.traces import TRACE_NAMES, TraceError, TraceWindow, window_pattern
from compass.evaluators.files import (
    MiB,
    UnsafeFileError,
    output_problem,
    read_regular,
    replacing,
    same_file,
    write_replacing,
)
from compass.examples import load_trace

if TYPE_CHECKING:
    from compass.dataplane.triton import GrpcTls

# Where a planner error's field comes from on the command line.
_PLAN_FLAGS = {"slo.latencyMs": "--slo-ms", "slo.percentile": "--percentile"}


# ---------------------------------------------------------------------------- reading


# The longest load compass simulates or sends: the simulator ticks through every decision
# interval of it (a second each by default, about a third of a millisecond per tick), so a
# typo like 1e7 s would run for hours however few requests arrive.
MAX_DURATION_S = 86_400
# The largest document (space, policy, profiles, search result) and trace compass reads.
MAX_DOCUMENT_BYTES = 32 * MiB
MAX_TRACE_BYTES = 64 * MiB
# The most values a YAML document may expand to through its aliases ("billion laughs": a few
# hundred bytes whose aliases expand to 9**9 strings would take hours to walk).
MAX_YAML_NODES = 1_000_000


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader (YAML 1.1), reading 1e-3 as the number YAML 1.2 and JSON make it."""


# YAML 1.1 wants a dot in a float's mantissa, so 1e-3 would load as the string '1e-3'.
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has with every alias expanded, counted without expanding
    (each node's size once); yaml.YAMLError past MAX_YAML_NODES or on a cycle."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > MAX_YAML_NODES:
                raise yaml.YAMLError(
                    f"its aliases expand it to more than {MAX_YAML_NODES:,} values"
                )
            sizes[key] = size
            continue
        if key in sizes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise yaml.YAMLError("an alias refers to the node that holds it")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _load_yaml(text: str) -> object:
    """YAML through the 1.2-number safe loader, its alias expansion bounded before it is built."""
    loader = _Yaml12Loader(text)  # a SafeLoader subclass: safe
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_document(text: str, path: Path | None = None) -> object:
    """A .json file as JSON only; other text as JSON if it is, else YAML (1e-3 a number in both);
    json.JSONDecodeError, ValueError (a huge integer), yaml.YAMLError or RecursionError if not."""
    if path is not None and path.suffix.lower() == ".json":
        # A .json file that is not JSON is a mistake: YAML would read it with other rules.
        return json.loads(text)
    try:
        return json.loads(text)
    except ValueError:
        return _load_yaml(text)


def check_not_input(flag: str, output: Path, inputs: Mapping[str, str | Path | None]) -> None:
    """Fail when the output names one of the command's input files: the same device and inode
    (a hard link), or the same path once symlinks are followed."""
    for input_flag, given in inputs.items():
        if given is not None and same_file(given, output):
            fail(flag, f"{output} is also {input_flag}", "write the output to another path")


# Larger integers have no use in any input compass reads, and do not convert to floats.
_MAX_INTEGER = 2**63


def _bad_number(data: object) -> tuple[str, str] | None:
    """The first NaN, infinity or huge integer in a parsed document: (its path, what it is)."""
    # A stack, not recursion: a document nested just short of the parser's limit must not
    # overflow here.
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where, f"{value} is not a finite number"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _MAX_INTEGER:
            return where, f"{describe_number(value)} is too large"
        items: Iterable[tuple[object, object]] = ()
        if isinstance(value, Mapping):
            items = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        for key, item in reversed(list(items)):  # the first item is looked at first
            if isinstance(key, int):
                stack.append((item, f"{where}[{key}]"))
            else:
                stack.append((item, f"{where}.{key}" if where else str(key)))
    return None


def read_input(flag: str, path: Path, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """A regular file's text, at most ``limit`` bytes of UTF-8; anything else is a usage error
    naming the flag (a FIFO or device is refused, never waited on or read without end)."""
    try:
        data = read_regular(path, limit)
    except UnsafeFileError as exc:
        fail(flag, exc.what, exc.fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(flag, f"{path} is not UTF-8 text (byte {exc.start})", "give a text file")


def read_document(flag: str, path: Path) -> object:
    """A parsed YAML or JSON file; any problem is one line naming the flag, the file and where."""
    text = read_input(flag, path)
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
    except ValueError as exc:  # int() past Python's digit limit, in JSON
        fail(f"{flag} {path}", f"not valid JSON ({exc})", "write a number of at most 19 digits")
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


def check_output(flag: str, path: Path, inputs: Mapping[str, str | Path | None]) -> None:
    """Fail unless path can take an output: none of ``inputs``, a regular file or nothing in an
    existing directory, never a symlink (the write would land on its target) or a device."""
    check_not_input(flag, path, inputs)
    problem = output_problem(path)
    if problem is not None:
        fail(flag, problem.what, problem.fix)


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A failed or refused write of ``path`` as a usage error naming it."""
    try:
        yield
    except UnsafeFileError as exc:
        fail(str(path), exc.what, exc.fix)
    except OSError as exc:
        fail(str(path), f"cannot write it ({exc.strerror})", "choose another path")


def write_text(path: Path, text: str) -> None:
    """Write a file atomically (files.write_replacing); a failure is a usage error naming it."""
    with _writing(path):
        write_replacing(path, text)


def save_output(path: Path, save: Callable[[Path], object]) -> None:
    """Have ``save`` write a file (a plot) at a temporary path beside ``path``, then rename it
    into place as write_text does; a failure is a usage error naming the path."""
    with _writing(path), replacing(path) as temporary:
        save(temporary)


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
    return _share(args.admission_quantile, "--admission-quantile", "0.5", default, below_one=True)


def admission_degrade_after(args: argparse.Namespace, default: float) -> float:
    """--degrade-after, checked to lie in (0, 1]; ``default`` when it is not given."""
    return _share(args.degrade_after, "--degrade-after", "0.25", default, below_one=False)


def _share(text: object, flag: str, example: str, default: float, *, below_one: bool) -> float:
    """A share in (0, 1), or (0, 1] unless ``below_one``; ``default`` when not given."""
    if text is None:
        return default
    share = parse_number(flag, str(text), example, low=0, inclusive=False)
    if share > 1 or (below_one and share == 1):
        fail(
            flag, f"{share:g} is not {'<' if below_one else '<='} 1", f"pass e.g. {flag} {example}"
        )
    return share


def read_trace(path: Path) -> list[float]:
    """Arrival times (s) from a file, one a line."""
    words = read_input("--trace", path, MAX_TRACE_BYTES).split()
    if len(words) > MAX_REQUESTS:
        fail(
            "--trace",
            f"{path} has {len(words):,} entries, above the {MAX_REQUESTS:,} compass replays",
            "replay a shorter stretch",
        )
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


def _check_trace_span(path: Path, times: Sequence[float]) -> None:
    """A trace may span at most MAX_DURATION_S: the simulator ticks through all of it, and
    binning its rate takes an array as long as its seconds (1e12 s: terabytes)."""
    finite = [t for t in times if math.isfinite(t)]
    if len(finite) < 2:
        return  # no span to speak of; the pattern reports empty or non-finite traces
    span = max(finite) - min(finite)
    if span > MAX_DURATION_S:
        fail(
            "--trace",
            f"{path} spans {describe_number(span)} s, above the {MAX_DURATION_S:,} s (a day) "
            "compass simulates",
            "replay a shorter stretch (times are in seconds)",
        )


def pattern_from_args(args: argparse.Namespace) -> tuple[LoadPattern, int]:
    """The load pattern and seed the shared flags describe; UsageError names the bad flag."""
    seed = parse_seed(str(args.seed))
    if (args.pattern == PatternKind.TRACE.value) != (args.trace is not None):
        fail("--trace", "--pattern trace and --trace FILE go together", "give both or neither")
    trace: Sequence[float] = ()
    if args.trace is not None:
        trace = read_trace(Path(str(args.trace)))
        _check_trace_span(Path(str(args.trace)), trace)
    duration = parse_number("--duration", str(args.duration), "180", low=0, inclusive=False)
    if duration > MAX_DURATION_S:
        fail(
            "--duration",
            f"{duration:g} s is longer than the {MAX_DURATION_S:,} s (a day) compass simulates "
            "or sends, whatever the rate",
            "shorten --duration",
        )
    base = parse_number("--base-qps", str(args.base_qps), "1.5", low=0, inclusive=False)
    try:
        return make_pattern(args.pattern, base, duration, seed=seed, trace_s=trace), seed
    except SimulationError as exc:
        flag = {"base_qps": "--base-qps", "duration": "--duration"}.get(exc.field, "--trace")
        raise UsageError(f"{flag}: {exc.what}; {exc.fix}") from None


def check_some_requests(pattern: LoadPattern, seed: int, requests: int) -> None:
    """Fail when the seeded load has no request at all: every figure over it would be empty,
    and a compliance over no request reads as 100%."""
    if requests == 0:
        fail(
            "--duration/--base-qps",
            f"no request arrives in {pattern.duration_s:g} s at {pattern.base_qps:g} QPS "
            f"(seed {seed}), so nothing would be served or measured",
            "raise --duration or --base-qps",
        )


# The trace window's fields as the flags spell them.
TRACE_FLAGS = {
    "start_s": "--window-start",
    "length_s": "--window-s",
    "utilisation": "--utilisation",
}
DEFAULT_UTILISATION = 0.7
DEFAULT_WINDOW_S = 600.0


def add_trace_window_arguments(parser: argparse.ArgumentParser) -> None:
    """--trace-name, --utilisation, --window-start and --window-s: a window of a shipped
    production trace as the load (`compass simulate`, bench/serving_triton.py)."""
    parser.add_argument(
        "--trace-name",
        choices=TRACE_NAMES,
        help="real load: a window of a shipped production trace (operator/compass/examples/"
        "traces/), stretched to --utilisation of the fastest member's capacity on every pod "
        "(instead of --pattern; docs/method.md, Real load: trace windows)",
    )
    parser.add_argument(
        "--utilisation",
        default=str(DEFAULT_UTILISATION),
        help=f"with --trace-name: the window's mean load as a share of the fastest member's "
        f"capacity (default {DEFAULT_UTILISATION:g})",
    )
    parser.add_argument(
        "--window-start",
        default="0",
        help="with --trace-name: where the window starts, in the trace's own seconds (default 0)",
    )
    parser.add_argument(
        "--window-s",
        default=str(DEFAULT_WINDOW_S),
        help=f"with --trace-name: the window's length in the trace's own seconds, before "
        f"stretching (default {DEFAULT_WINDOW_S:g})",
    )


def trace_window_pattern(
    args: argparse.Namespace, fastest_mean_ms: float, pods: int
) -> LoadPattern:
    """--trace-name's window, stretched to --utilisation of the capacity of the fastest member
    (its mean service time) on every pod: the same cut and stretch as the benches."""
    if args.trace is not None or args.pattern != PatternKind.SPIKE.value:
        fail("--trace-name", "is a load of its own", "drop --pattern and --trace, or --trace-name")
    utilisation = parse_number(
        "--utilisation", str(args.utilisation), "0.7", low=0, inclusive=False
    )
    window = TraceWindow(
        args.trace_name,
        parse_number("--window-start", str(args.window_start), "0", low=0, inclusive=True),
        parse_number("--window-s", str(args.window_s), "600", low=0, inclusive=False),
    )
    try:
        return window_pattern(load_trace(window.trace), window, utilisation, fastest_mean_ms, pods)
    except TraceError as exc:
        flag = TRACE_FLAGS.get(exc.field, "--trace-name")
        fix = exc.fix.replace("length_s", "--window-s")
        raise UsageError(f"{flag}: {exc.what}; {fix}") from None


# A PEM file of ours is a few KiB; a bundle of every public CA is about 200 KiB.
MAX_PEM_BYTES = 1 * MiB


def add_triton_arguments(
    parser: argparse.ArgumentParser,
    triton_help: str,
    *,
    required: bool = True,
    metavar: str = "HOST:PORT",
    router_help: str = "router model name",
) -> None:
    """--triton, --router and TLS (and mutual TLS) to Triton's gRPC port."""
    parser.add_argument("--triton", required=required, metavar=metavar, help=triton_help)
    parser.add_argument("--router", default=DEFAULT_ROUTER_MODEL, help=router_help)
    parser.add_argument(
        "--triton-ca",
        metavar="CA.pem",
        help="TLS to Triton's gRPC port: verify its certificate against this PEM CA bundle "
        "(Triton's --grpc-use-ssl)",
    )
    parser.add_argument(
        "--triton-cert",
        metavar="CERT.pem",
        help="mutual TLS: the client certificate to present (with --triton-key; Triton's "
        "--grpc-use-ssl-mutual)",
    )
    parser.add_argument("--triton-key", metavar="KEY.pem", help="mutual TLS: its private key")
    parser.add_argument(
        "--triton-server-name",
        metavar="NAME",
        help="the name Triton's certificate carries where it is not the address's host (a "
        "pod dialled by IP, a certificate for its Service)",
    )


def triton_tls(args: argparse.Namespace) -> GrpcTls | None:
    """The TLS the --triton-* flags ask for (None: plaintext); UsageError naming the flag."""
    # Here, not at the top: every command imports this module, few talk gRPC.
    from compass.dataplane.triton import GrpcTls

    flags = {
        "--triton-ca": args.triton_ca,
        "--triton-cert": args.triton_cert,
        "--triton-key": args.triton_key,
        "--triton-server-name": args.triton_server_name,
    }
    if all(value is None for value in flags.values()):
        return None
    if (args.triton_cert is None) != (args.triton_key is None):
        missing = "--triton-key" if args.triton_key is None else "--triton-cert"
        fail(missing, "mutual TLS needs the client certificate and its key", f"add {missing}")
    pems: dict[str, bytes | None] = dict.fromkeys(("--triton-ca", "--triton-cert", "--triton-key"))
    for flag in pems:
        path = flags[flag]
        if path is None:
            continue
        try:
            data = read_regular(Path(str(path)), MAX_PEM_BYTES)
        except UnsafeFileError as error:
            fail(flag, error.what, error.fix)
        if b"-----BEGIN " not in data:
            fail(flag, f"{path} is not PEM (no -----BEGIN line)", "give a PEM file")
        pems[flag] = data
    name = args.triton_server_name
    if name is not None and not re.fullmatch(
        r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", name
    ):
        fail("--triton-server-name", f"{name!r} is not a DNS name", "give e.g. triton.ml.svc")
    return GrpcTls(pems["--triton-ca"], pems["--triton-cert"], pems["--triton-key"], name)

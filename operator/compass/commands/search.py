"""`compass search`: every configuration that reaches tau, scored by replay, a command or Triton."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from compass.commands.common import (
    add_triton_arguments,
    check_endpoint,
    check_not_input,
    read_document,
    triton_tls,
)
from compass.commands.search_common import (
    add_settings,
    check_budgets,
    parse_settings,
    summary,
    write_result,
)
from compass.console import Terminated, UsageError, fail, parse_int, search_with_progress
from compass.dataplane.triton import RoutingError
from compass.domain.evaluation import EvaluationError, Evaluator, ParamValue
from compass.domain.search import MAX_CONCURRENCY, MAX_DATASET_SIZE, SearchSettings
from compass.domain.space import Space, SpaceError, SpaceSpec, config_key, explain_validation_error
from compass.domain.statistics import StoppingRule
from compass.evaluators.concurrency import ThreadRunner, VirtualRunner, jittered_service
from compass.evaluators.factory import ScoreSource, fleet_concurrency, make_evaluator, make_runner
from compass.evaluators.files import same_file
from compass.evaluators.ledger import (
    CheckpointedEvaluator,
    CheckpointLedger,
    Ledger,
    LedgerBusyError,
    LedgerError,
    LedgerLock,
    TruncatedLineError,
    partial_path,
    read_ledger,
    read_ledger_bytes,
)

DEFAULT_LEDGER = "compass-search.ledger.jsonl"
_PROG = "compass search"

# The fix to suggest for pydantic errors whose message does not carry one.
_PYDANTIC_FIXES = {
    "missing": "add it",
    "too_short": "give at least one",
    "extra_forbidden": "remove it or fix its spelling",
    "enum": "use one of those",
    "literal_error": "use one of those",
    "string_pattern_mismatch": "start with a letter or _ and use only letters, digits and _",
    "string_too_long": "shorten it",
}


def register(commands: Any, summary: str) -> None:
    """Add `compass search` to the `compass` parser."""
    run = commands.add_parser(
        "search",
        help=summary,
        description="Search a configuration space for every configuration whose accuracy is "
        ">= tau. Scores come from a replay ledger (--replay) or from your own command "
        "(--command). Every evaluated batch is appended to a checkpoint ledger, so an "
        "interrupted run continues with --resume.",
    )
    run.add_argument("--space", help="space file (YAML or JSON: parameters and constraints)")
    run.add_argument(
        "--replay",
        metavar="LEDGER",
        help='JSONL ledger of recorded scores, one {"config": ..., "scores": [...]} a line',
    )
    run.add_argument(
        "--command",
        metavar='"CMD ARGS"',
        help="command that scores a configuration: reads "
        '{"config": ..., "samples": [...]} on stdin, prints a JSON list of scores',
    )
    add_triton_arguments(
        run,
        "score live through the Triton router (gRPC) with a per-request configuration",
        required=False,
        router_help="router model name (with --triton)",
    )
    run.add_argument("--samples", metavar="N", help="dataset size (with --command or --triton)")
    run.add_argument(
        "--concurrency",
        default=AUTO_CONCURRENCY,
        metavar="K",
        help="evaluations kept in flight: Triton requests spread over the --triton addresses "
        "(give one per pod, comma-separated), or command processes; the answer is the same "
        f"at any K. Default {AUTO_CONCURRENCY}: with --triton, the addresses x the router's "
        "instances (its model config's instance_group), else 1",
    )
    run.add_argument(
        "--service-ms",
        metavar="MS",
        help="with --replay: simulate requests taking about MS milliseconds each, served "
        "--concurrency at a time on a virtual clock, and report the wall time it would take",
    )
    run.add_argument(
        "--ledger",
        metavar="PATH",
        help=f"checkpoint ledger (default: next to --output, else ./{DEFAULT_LEDGER})",
    )
    run.add_argument("--resume", metavar="LEDGER", help="continue the run checkpointed in LEDGER")
    run.add_argument(
        "--allow-truncated",
        action="store_true",
        help="accept a --replay ledger whose last line is cut short (no newline, not JSON: a "
        "write that was interrupted) and skip that line; without it such a file is refused",
    )
    add_settings(run, tau_default=None)
    run.set_defaults(handler=search_command)


# ---------------------------------------------------------------------------- the space file


def _load_space(path: Path) -> Space:
    """Read and validate a space file; any problem is a UsageError naming the file."""
    field = f"--space {path}"
    data = read_document("--space", path)
    prefix = ""
    if isinstance(data, dict) and isinstance(data.get("spec"), dict) and "space" in data["spec"]:
        # A whole CompoundWorkflow manifest: its spec.space is the space.
        data, prefix = data["spec"]["space"], "spec.space."
    if not isinstance(data, dict):
        fail(
            field,
            f"expected a mapping with parameters and constraints, got {type(data).__name__}",
            "write parameters: [...] and constraints: [...] at the top level",
        )
    try:
        spec = SpaceSpec.model_validate(data)
    except ValidationError as exc:
        message = explain_validation_error(exc)
        if "; " not in message:  # pydantic's own message, which carries no fix
            kind = str(exc.errors()[0].get("type", ""))
            message += f"; {_PYDANTIC_FIXES.get(kind, 'fix the space file')}"
        raise UsageError(f"{field}: {prefix}{message}") from None
    try:
        return Space(spec)
    except SpaceError as exc:
        raise UsageError(f"{field}: {exc}") from None


# ---------------------------------------------------------------------------- the replay ledger


@dataclass(frozen=True)
class _ReplayLine:
    """Where one replay-ledger line is, and what it holds."""

    number: int
    config: dict[str, ParamValue]
    samples: list[int]


def _replay_lines(path: Path) -> list[_ReplayLine]:
    """The lines of a ledger that read_ledger has already validated, with their numbers."""
    found = []
    for number, raw in enumerate(read_ledger_bytes(path).split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            # read_ledger accepted the file, so this is the torn final line it dropped.
            break
        scores = obj["scores"]
        samples = obj.get("samples", list(range(len(scores))))
        found.append(_ReplayLine(number, obj["config"], [int(i) for i in samples]))
    return found


def _check_replay_line(
    line: _ReplayLine,
    path: Path,
    first: _ReplayLine,
    longest: _ReplayLine,
    budgets: tuple[int, ...] | None,
    space: Space | None,
) -> None:
    """One line of the replay ledger against the others, the budgets and the space."""
    where = f"--replay {path} line {line.number}"
    count = len(line.samples)
    population = len(longest.samples)
    if sorted(line.samples) != list(range(count)):
        fail(
            where,
            f"its samples are not 0..{count - 1}",
            'a replay ledger scores every configuration on samples 0..N-1 (leave "samples" '
            "out to mean 0..len-1)",
        )
    if budgets is not None and count < budgets[-1]:
        fail(
            where,
            f"{count} scores, fewer than the largest budget {budgets[-1]}",
            f"record at least {budgets[-1]} samples for every configuration, or lower --budgets",
        )
    if count != population:
        fail(
            where,
            f"{count} scores, but line {longest.number} has {population}",
            "every line must score the same samples 0..N-1",
        )
    if space is not None:
        try:
            space.index(line.config)
        except SpaceError as exc:
            fail(where, str(exc), "remove the line, or add the configuration to --space")
    elif sorted(line.config) != sorted(first.config):
        fail(
            where,
            f"it sets {', '.join(sorted(line.config))}, line {first.number} sets "
            f"{', '.join(sorted(first.config))}",
            "every configuration must set the same parameters (or pass --space)",
        )


def _load_replay(
    path: Path, space: Space | None, given: tuple[int, ...] | None, allow_truncated: bool
) -> tuple[Ledger, int]:
    """Read a replay ledger and check it against the budgets and the space; its dataset size."""
    try:
        ledger = read_ledger(path, allow_truncated=allow_truncated)
    except TruncatedLineError as exc:
        # Searching on what is left would silently drop a configuration's scores.
        raise UsageError(f"--replay: {exc}, or pass --allow-truncated to skip it") from None
    except LedgerError as exc:
        raise UsageError(f"--replay: {exc}") from None
    lines = _replay_lines(path)
    if not lines:
        fail(
            "--replay",
            f"{path} holds no scores",
            'write one {"config": ..., "scores": [...]} a line',
        )
    longest = max(lines, key=lambda line: len(line.samples))
    population = len(longest.samples)
    check_budgets(given, population, f"scores per line of {path}")
    for line in lines:
        _check_replay_line(line, path, lines[0], longest, given, space)
    return ledger, population


# ---------------------------------------------------------------------------- the checkpoint


def _checkpoint_path(args: argparse.Namespace, output: Path | None) -> tuple[Path, bool]:
    """The checkpoint ledger's path and whether it continues an earlier run."""
    if args.resume is not None:
        resume = Path(str(args.resume))
        if args.ledger is not None and not same_file(str(args.ledger), resume):
            fail(
                "--ledger",
                f"{args.ledger} differs from --resume {resume}",
                "pass only --resume: new batches are appended to the ledger being resumed",
            )
        if not resume.is_file():
            fail(
                "--resume",
                f"{resume}: no such file",
                "check the path, or leave --resume out to start afresh",
            )
        return resume, True
    if args.ledger is not None:
        path = Path(str(args.ledger))
    elif output is not None:
        path = output.with_suffix(".ledger.jsonl")
    else:
        path = Path(DEFAULT_LEDGER)
    if path.exists():
        fail(
            "--ledger", f"{path} exists", f"pass --resume {path} to continue that run, or remove it"
        )
    if not path.parent.is_dir():
        fail(
            "--ledger",
            f"directory {path.parent} does not exist",
            "create it first or choose another path",
        )
    return path, False


def _check_resume(path: Path, space: Space, population: int, replay: Ledger | None) -> int:
    """Check a checkpoint belongs to this search; return how many facts it holds."""
    try:
        # A checkpoint's cut-short last line is a killed run's: it is set aside on open.
        facts = read_ledger(path, allow_truncated=True)
    except LedgerError as exc:
        raise UsageError(f"--resume: {exc}") from None
    other = "this checkpoint belongs to another search: pass that search's inputs, or remove it"
    for config in facts.configs():
        key = config_key(config)
        if config not in space:
            fail(f"--resume {path}", f"configuration {key} is not in the space", other)
        scores = facts.scores(config)
        if max(scores, default=-1) >= population:
            fail(
                f"--resume {path}",
                f"configuration {key} has sample {max(scores)} but the dataset has "
                f"{population} samples",
                other,
            )
        if replay is None:
            continue
        recorded = replay.lookup(config, list(scores))
        for (index, score), expected in zip(scores.items(), recorded.tolist(), strict=True):
            if score != expected:
                fail(
                    f"--resume {path}",
                    f"sample {index} of configuration {key} scores {score} here but "
                    f"{expected} in the replay ledger",
                    other,
                )
    return facts.fact_count


# ---------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Scores:
    """Where the scores come from, and what that settles: the space and the dataset size."""

    source: ScoreSource
    space: Space
    population: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Plan:
    """A fully validated search, ready to run; nothing has been written yet."""

    scores: _Scores
    inner: Evaluator
    settings: SearchSettings
    checkpoint: Path
    resumed_facts: int | None
    output: Path | None
    concurrency: int
    service_s: float | None


# --concurrency's default: the fleet's, read from the router (see _auto_concurrency).
AUTO_CONCURRENCY = "auto"


def _check_one_source(args: argparse.Namespace) -> None:
    """Exactly one of --replay, --command and --triton."""
    sources = [a for a in ("replay", "command", "triton") if getattr(args, a) is not None]
    if len(sources) != 1:
        what = "neither given" if not sources else f"{' and '.join(sources)} given"
        fail(
            "--replay/--command/--triton",
            what,
            'pass exactly one: --replay LEDGER (recorded scores), --command "CMD ARGS" or '
            "--triton HOST:PORT (score live)",
        )


def _replay_scores(
    args: argparse.Namespace, space: Space | None, settings: SearchSettings, checkpoint: Path
) -> _Scores:
    """--replay: the ledger settles the dataset size, and the space when --space is absent."""
    if args.samples is not None:
        fail(
            "--samples",
            "only used with --command",
            "leave it out: the replay ledger sets the dataset size",
        )
    path = Path(str(args.replay))
    if same_file(path, checkpoint):
        fail("--ledger", f"{checkpoint} is the --replay ledger", "give the checkpoint its own file")
    ledger, population = _load_replay(path, space, settings.budgets, bool(args.allow_truncated))
    notes: list[str] = []
    if space is None:
        try:
            space = Space.infer(ledger.configs())
        except SpaceError as exc:
            raise UsageError(f"--replay {path}: {exc}") from None
        notes.append(
            f"no --space given: inferred the space from the {len(ledger):,} "
            f"configurations in {path} (pass --space to search beyond them):\n"
            f"{space.describe()}"
        )
    else:
        absent = sum(1 for i in range(space.size) if space.config(i) not in ledger)
        if absent:
            notes.append(
                f"note: {path} has no scores for {absent:,} of the space's "
                f"{space.size:,} configurations; the search stops with an error if it "
                "needs one"
            )
    return _Scores(ScoreSource(replay=ledger), space, population, tuple(notes))


def _live_scores(
    args: argparse.Namespace, space: Space | None, settings: SearchSettings
) -> _Scores:
    """--command or --triton: scores computed now, over a space and dataset size given here."""
    live = "--command" if args.command is not None else "--triton"
    if space is None:
        fail("--space", f"required with {live}", "pass --space SPACE.yaml")
    if args.samples is None:
        fail("--samples", f"required with {live}", "pass the dataset size, e.g. --samples 100")
    population = parse_int("--samples", str(args.samples), "100", low=1, high=MAX_DATASET_SIZE)
    check_budgets(settings.budgets, population, "--samples")
    if args.triton is not None:
        for address in str(args.triton).split(","):
            check_endpoint("--triton", address.strip())
        source = ScoreSource(
            triton=str(args.triton), router_model=str(args.router), tls=triton_tls(args)
        )
    else:
        try:
            argv = shlex.split(str(args.command))
        except ValueError as exc:  # an unbalanced quote
            fail("--command", f"{args.command!r}: {exc}", "balance the quotes, as a shell would")
        if not argv:
            fail(
                "--command",
                "empty",
                'pass the program and its arguments, e.g. --command "python score.py"',
            )
        source = ScoreSource(command=argv)
    return _Scores(source=source, space=space, population=population)


def _check_stopping_rule(scores: _Scores, settings: SearchSettings) -> None:
    """The budgets, confidence and dataset size must admit an early-stopping test."""
    try:
        StoppingRule(
            tau=settings.tau,
            population=scores.population,
            budgets=settings.budgets,
            confidence=settings.confidence,
            space_size=scores.space.size,
            method=settings.interval,
        )
    except ValueError as exc:
        fail("--budgets", str(exc), "fix the search settings")


def _plan_search(args: argparse.Namespace) -> _Plan:
    """Validate every input of `compass search`; raise UsageError on the first problem."""
    _check_one_source(args)
    if args.output is not None:
        # Before parse_settings refuses a symlink: one to an input is said as such.
        check_not_input("--output", Path(str(args.output)), {"--replay": args.replay})
    settings, output = parse_settings(args)
    checkpoint, resuming = _checkpoint_path(args, output)
    if output is not None:
        if same_file(output, checkpoint):
            fail("--output", f"{output} is also the checkpoint ledger", "choose another path")
        check_not_input("--output", output, {"--replay": args.replay, "--space": args.space})
    space = None if args.space is None else _load_space(Path(str(args.space)))
    if args.replay is not None:
        scores = _replay_scores(args, space, settings, checkpoint)
    else:
        scores = _live_scores(args, space, settings)
    _check_stopping_rule(scores, settings)
    if str(args.concurrency) == AUTO_CONCURRENCY:
        concurrency, note = _auto_concurrency(scores.source)
        if note is not None:
            scores = replace(scores, notes=(*scores.notes, note))
    else:
        concurrency = parse_int(
            "--concurrency", str(args.concurrency), "8", low=1, high=MAX_CONCURRENCY
        )
    service_s = None
    if args.service_ms is not None:
        if args.replay is None:
            fail(
                "--service-ms",
                "only used with --replay",
                "leave it out: live scores take real time",
            )
        service_s = _parse_positive("--service-ms", str(args.service_ms)) / 1000
    resumed = (
        _check_resume(checkpoint, scores.space, scores.population, scores.source.replay)
        if resuming
        else None
    )
    return _Plan(
        scores=scores,
        inner=make_evaluator(scores.source),
        settings=settings,
        checkpoint=checkpoint,
        resumed_facts=resumed,
        output=output,
        concurrency=concurrency,
        service_s=service_s,
    )


def _auto_concurrency(source: ScoreSource) -> tuple[int, str | None]:
    """--concurrency auto: the fleet's with --triton (fleet_concurrency), and a note saying
    how it was counted; else 1."""
    if source.triton is None:
        return 1, None
    try:
        concurrency, counted = fleet_concurrency(source)
    except RoutingError as error:
        fail(
            "--concurrency",
            f"auto could not read the router's instances: {error}",
            "start Triton first, or give K",
        )
    return concurrency, f"concurrency {concurrency} (auto: {counted})"


def _parse_positive(flag: str, text: str) -> float:
    """A number > 0, or a usage error naming the flag."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        fail(flag, f"{text!r} is not a positive number", f"pass e.g. {flag} 1500")
    return value


# ---------------------------------------------------------------------------- the command


def search_command(args: argparse.Namespace) -> int:
    """`compass search`: validate everything, then search with a checkpoint."""
    plan = _plan_search(args)
    # Two searches appending to one ledger would interleave their batches.
    lock = LedgerLock(plan.checkpoint)
    flag = "--ledger" if plan.resumed_facts is None else "--resume"
    try:
        lock.acquire()
    except LedgerBusyError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    except OSError as exc:
        fail(flag, f"cannot lock {plan.checkpoint} ({exc.strerror})", "check the directory")
    for note in plan.scores.notes:
        print(f"{_PROG}: {note}", file=sys.stderr)
    if plan.resumed_facts is not None:
        print(
            f"{_PROG}: resuming from {plan.checkpoint} ({plan.resumed_facts:,} sample evaluations "
            "recorded)",
            file=sys.stderr,
        )
    try:
        return _search_locked(plan, lock)
    finally:
        lock.release()


def _search_locked(plan: _Plan, lock: LedgerLock) -> int:
    """The search, once it holds the checkpoint ledger's lock."""
    if plan.resumed_facts is None and plan.checkpoint.exists():
        # Another search made it between our check and our lock.
        fail("--ledger", f"{plan.checkpoint} exists", f"pass --resume {plan.checkpoint}")
    try:
        checkpoint = CheckpointLedger(plan.checkpoint)
        # A new ledger exists only now: lock its file too, as a resumed one was at acquire().
        lock.hold_ledger()
    except LedgerBusyError as exc:
        raise UsageError(f"--ledger: {exc}") from None
    except (LedgerError, OSError) as exc:
        fail("--ledger", str(exc), "check the path")
    if checkpoint.set_aside:
        print(
            f"{_PROG}: the last line of {plan.checkpoint} was cut short (a killed run); its "
            f"{checkpoint.set_aside:,} bytes are kept in {partial_path(plan.checkpoint)} and its "
            "samples are evaluated again",
            file=sys.stderr,
        )
    evaluator = CheckpointedEvaluator(plan.inner, checkpoint)
    resume_hint = f"rerun with --resume {plan.checkpoint} to continue"
    simulated = (
        None
        if plan.service_s is None
        else VirtualRunner(evaluator, plan.concurrency, jittered_service(plan.service_s))
    )
    runner = simulated or make_runner(plan.scores.source, evaluator, plan.concurrency)
    try:
        outcome = search_with_progress(
            plan.scores.space, evaluator, plan.scores.population, plan.settings, runner
        )
        write_result(outcome, plan.output)
    except (EvaluationError, LedgerError, OSError) as exc:
        done = checkpoint.ledger.fact_count
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        print(
            f"{_PROG}: {plan.checkpoint} keeps the {done:,} sample evaluations done so far; "
            f"fix the problem and {resume_hint}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(
            f"{_PROG}: {'terminated' if terminated else 'interrupted'}; {resume_hint}",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    finally:
        if isinstance(runner, ThreadRunner):
            runner.close()
    if simulated is not None:
        print(
            f"{_PROG}: simulated wall time {simulated.clock:,.1f} s at concurrency "
            f"{plan.concurrency} ({simulated.busy:,.1f} s of service: "
            f"{simulated.busy / max(simulated.clock, 1e-9):.1f} requests in flight on average)",
            file=sys.stderr,
        )
    if isinstance(runner, ThreadRunner | VirtualRunner) and runner.wasted:
        print(
            f"{_PROG}: {runner.wasted:,} samples scored ahead on idle requests were never "
            "asked for (not recorded)",
            file=sys.stderr,
        )
    if plan.resumed_facts is not None:
        print(
            f"{_PROG}: reused {evaluator.reused:,} sample evaluations from {plan.checkpoint}; "
            f"evaluated {evaluator.computed:,} new",
            file=sys.stderr,
        )
    ledger = (
        f"{plan.checkpoint} ({evaluator.computed:,} new sample evaluations, "
        f"{evaluator.reused:,} reused)"
    )
    print(summary(outcome, plan.settings, plan.output, ledger))
    return 0

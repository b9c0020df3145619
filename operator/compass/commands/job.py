"""`compass job search|profile --state NAME`: what the operator's Jobs run inside their pods.

The state ConfigMap (job_state.StateStore) holds the workflow spec frozen at one generation, the
search ledger (MirroredEvaluator appends to it, so a retried pod resumes) and the results, for
the operator to read. The profiling Job is job_profile.run_profile.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from compass.api.compoundworkflow import CompoundWorkflowSpec, EvaluatorType
from compass.commands.job_profile import run_profile
from compass.commands.job_state import StateStore
from compass.commands.job_triton import triton_pods, triton_tls
from compass.console import describe_rate
from compass.controllers.builders import (
    LEDGER_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    SPEC_KEY,
    evaluated_spec,
    triton_address,
)
from compass.controllers.conditions import one_line
from compass.controllers.ledgerchunks import (
    FLUSH_INTERVAL_S,
    PENDING_TEXT,
    FlushClock,
    text_limit,
)
from compass.domain.evaluation import Config
from compass.domain.search import (
    Progress,
    SearchSettings,
    complete_feasible,
    search,
)
from compass.domain.space import Space
from compass.evaluators.concurrency import ThreadRunner
from compass.evaluators.factory import ScoreSource, fleet_concurrency, make_evaluator, make_runner
from compass.evaluators.ledger import CheckpointedEvaluator, CheckpointLedger, parse_ledger

# The search's clock for its writes (FlushClock): a test sets its own.
monotonic = time.monotonic

PROGRESS_MIN_SAMPLES = 10
# The search Job logs a progress line this often: evaluations per second, done and an ETA bound.
PROGRESS_LOG_INTERVAL_S = 30.0


def best_accuracy(checkpoint: CheckpointLedger, min_samples: int) -> float | None:
    """The highest mean score of a configuration scored on at least min_samples samples."""
    ledger = checkpoint.ledger
    means = [
        sum(scores.values()) / len(scores)
        for scores in (ledger.scores(config) for config in ledger.configs())
        if len(scores) >= min_samples
    ]
    return max(means) if means else None


class MirroredEvaluator:
    """Appends the checkpoint ledger's new lines to the state as batches are evaluated, at most
    once per FLUSH_INTERVAL_S (FlushClock): a killed pod (the Job's backoffLimit) or a restarted
    operator redoes at most the batches of the last FLUSH_INTERVAL_S seconds and the one in
    flight."""

    def __init__(
        self, inner: CheckpointedEvaluator, store: StateStore, ledger: Path, min_samples: int
    ) -> None:
        self.inner = inner
        self.store = store
        self.ledger = ledger
        self.min_samples = min_samples
        self.progress: Progress | None = None
        self.rate: str | None = None  # evaluations per second and the ETA bound, for the status
        # Bytes of the local ledger the state holds already: what it was opened from.
        self.mirrored = ledger.stat().st_size
        self.seen = self.mirrored  # bytes of the local ledger counted as waiting or mirrored
        self.flushes = FlushClock(FLUSH_INTERVAL_S, PENDING_TEXT)
        # A concurrent search calls evaluate from several threads: the state writes (and the
        # read of the local ledger they send) take turns, and hold the checkpoint's lock so
        # that no line is read while another thread appends it.
        self.lock = threading.Lock()

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Evaluate; write what waits when due (FlushClock), before and after the batch."""
        with self.lock:
            self._write_if_due()
        scores = self.inner.evaluate(config, sample_indices)
        self._count_new_lines()
        return scores

    def evaluate_unrecorded(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Evaluate without recording (a concurrent runner records whole chunks, ``record``);
        write what waits when due."""
        with self.lock:
            self._write_if_due()
        return self.inner.evaluate_unrecorded(config, sample_indices)

    def record(
        self, config: Config, sample_indices: Sequence[int], scores: Sequence[float]
    ) -> None:
        """Record in the local ledger; write what waits to the state when due."""
        self.inner.record(config, sample_indices, scores)
        self._count_new_lines()

    def _count_new_lines(self) -> None:
        """Count the local ledger's new bytes as waiting, and write them when due."""
        with self.lock, self.inner.lock:
            size = self.ledger.stat().st_size
            if size != self.seen:
                self.flushes.add(size - self.seen)
                self.seen = size
        with self.lock:
            self._write_if_due()

    def _write_if_due(self) -> None:
        if not self.flushes.due(monotonic()):
            return
        data = {}
        if self.progress is not None:
            best = best_accuracy(self.inner.checkpoint, self.min_samples)
            # progress.json: the last snapshot, the best accuracy seen so far and the rate.
            progress = {**self.progress.__dict__, "best_accuracy": best, "rate": self.rate}
            data[PROGRESS_KEY] = json.dumps(progress)
        self.flush(data)

    def flush(self, data: Mapping[str, str]) -> None:
        """Append the lines not yet in the state, with these state keys."""
        with self.inner.lock, self.ledger.open("rb") as f:
            f.seek(self.mirrored)
            new = f.read()
        if new:
            self.store.append_ledger(new.decode("utf-8"), data)
            self.mirrored += len(new)
        elif data:
            self.store.write(data)
        self.seen = self.mirrored
        self.flushes.written(monotonic())


def _score_source(spec: CompoundWorkflowSpec, namespace: str) -> ScoreSource:
    """Where the spec's evaluator takes its scores from, as the evaluator factory reads it."""
    evaluator = spec.evaluation.evaluator
    if evaluator.type is EvaluatorType.TRITON:
        workflow = {"metadata": {"namespace": namespace}}
        address = os.environ.get("COMPASS_TRITON_ADDRESS") or triton_address(
            workflow, evaluated_spec(spec)
        )
        return ScoreSource(
            triton=address,
            router_model=spec.triton.router_model,
            tls=triton_tls(spec, namespace),
        )
    if evaluator.type is EvaluatorType.COMMAND:
        assert evaluator.command
        return ScoreSource(command=evaluator.command)
    name = evaluator.replay_config_map
    assert name is not None
    recorded = StateStore(name, namespace).read_ledger()
    return ScoreSource(replay=parse_ledger(recorded, f"ConfigMap {name} (its ledger)"))


def fleet_source(spec: CompoundWorkflowSpec, namespace: str, source: ScoreSource) -> ScoreSource:
    """With the triton evaluator and no concurrency given, the requests go to the Service's
    ready pods themselves, as profiling's do (triton_pods), so every pod gets its share of the
    fleet's concurrency; otherwise the source as it is."""
    if source.triton is None or spec.evaluation.concurrency is not None:
        return source
    pods, where = triton_pods(spec, namespace)
    print(f"search: scoring on {len(pods)} pod(s), {where}", flush=True)
    return replace(source, triton=",".join(pod.grpc_url for pod in pods))


def search_concurrency(spec: CompoundWorkflowSpec, source: ScoreSource) -> tuple[int, str]:
    """The search's concurrency, and why: spec.evaluation.concurrency if given, else the
    fleet's (fleet_concurrency: its pods x the router's instances; 1 without Triton)."""
    given = spec.evaluation.concurrency
    if given is not None:
        return given, "spec.evaluation.concurrency"
    return fleet_concurrency(source)


def run_search(state_name: str, namespace: str) -> int:
    """Search the frozen spec, resuming from the ledger in the state ConfigMap."""
    store = StateStore(state_name, namespace)
    state = store.read()
    spec = CompoundWorkflowSpec.model_validate_json(state[SPEC_KEY])
    space = Space(spec.space)
    workdir = Path(tempfile.mkdtemp(prefix="compass-search-"))
    ledger = workdir / LEDGER_KEY
    limit = text_limit(space.size, spec.evaluation.dataset.size)
    ledger.write_text(store.read_ledger(limit), encoding="utf-8")
    checkpoint = CheckpointLedger(ledger)
    if checkpoint.facts_at_open:
        print(f"resuming: {checkpoint.facts_at_open} sample evaluations already recorded")
    source = fleet_source(spec, namespace, _score_source(spec, namespace))
    checkpointed = CheckpointedEvaluator(make_evaluator(source), checkpoint)
    budgets = spec.evaluation.budgets
    # A mean over a handful of samples is noise: the progress's best needs some evidence.
    least = budgets[0] if budgets else min(PROGRESS_MIN_SAMPLES, spec.evaluation.dataset.size)
    mirrored = MirroredEvaluator(checkpointed, store, ledger, least)

    started = monotonic()
    logged = [started]

    def progress(snapshot: Progress) -> None:
        mirrored.progress = snapshot
        now = monotonic()
        mirrored.rate = describe_rate(snapshot, now - started)
        if now - logged[0] >= PROGRESS_LOG_INTERVAL_S:
            logged[0] = now
            print(
                f"search: {snapshot.phase}, configs {snapshot.configs_evaluated}/"
                f"{snapshot.space_size}, samples {snapshot.sample_evals:,}, feasible "
                f"{snapshot.feasible}, {mirrored.rate}",
                flush=True,
            )

    evaluation = spec.evaluation
    settings = SearchSettings(
        tau=evaluation.tau,
        budgets=None if evaluation.budgets is None else tuple(evaluation.budgets),
        confidence=evaluation.confidence,
        seed=evaluation.seed,
        method=evaluation.method,
        interval=evaluation.interval,
        batch=evaluation.batch,
    )
    concurrency, why = search_concurrency(spec, source)
    runner = make_runner(source, mirrored, concurrency)
    print(f"search: concurrency {concurrency} ({why}), batch {evaluation.batch}", flush=True)
    try:
        searched = search(space, mirrored, evaluation.dataset.size, settings, progress, runner)
        # The planner orders the front by accuracy: score the feasible set on every sample,
        # as many requests in flight as the search kept.
        outcome = complete_feasible(searched, mirrored, runner)
    finally:
        if isinstance(runner, ThreadRunner):
            runner.close()
    result = outcome.result_document()
    mirrored.flush(
        {
            RESULT_KEY: json.dumps(result),
            PROGRESS_KEY: json.dumps(
                {
                    "phase": "done",
                    "configs_evaluated": outcome.configs_evaluated,
                    "sample_evals": outcome.sample_evals,
                    "feasible": len(outcome.feasible),
                    "space_size": space.size,
                    "best_accuracy": max((a.accuracy for a in outcome.assessments), default=None),
                }
            ),
        }
    )
    print(
        f"search done: {len(outcome.feasible)} feasible of {outcome.configs_evaluated} evaluated, "
        f"{searched.sample_evals} sample evaluations, then "
        f"{outcome.sample_evals - searched.sample_evals} to score the feasible ones on all "
        f"{evaluation.dataset.size} samples ({checkpointed.reused} reused from the ledger)"
    )
    return 0


def error_line(error: BaseException) -> str:
    """An exception as one line: the API's own message for API errors, whitespace collapsed."""
    status = getattr(error, "status", None)
    body = getattr(error, "body", None)
    text = str(error)
    if status is not None and body:
        try:
            message = json.loads(body).get("message")
        except (TypeError, ValueError, AttributeError):
            message = None
        text = f"{status} {getattr(error, 'reason', '')}: {message or body}"
    # The operator copies the pod's last line into a condition message: bounded the same.
    return one_line(f"{type(error).__name__}: {text}")


def main(role: str, state_name: str) -> int:
    """Entry point of `compass job ROLE --state NAME`."""
    namespace = os.environ.get("COMPASS_NAMESPACE", "default")
    runner = run_search if role == "search" else run_profile
    try:
        return runner(state_name, namespace)
    except Exception as error:
        # The last line becomes the pod's termination message, then the workflow's condition.
        print(f"compass job {role}: {error_line(error)}", file=sys.stderr)
        return 1


def register(commands: Any, summary: str) -> None:
    """Add `compass job` to the `compass` parser."""
    job = commands.add_parser(
        "job",
        help=summary,
        description="What the search and profiling Jobs run: read the workflow spec and the "
        "ledger from the state ConfigMap (namespace from $COMPASS_NAMESPACE), resume, and write "
        "the ledger, the progress and the result back to it.",
    )
    job.add_argument("role", choices=["search", "profile"], help="which Job this is")
    job.add_argument("--state", required=True, metavar="CONFIGMAP", help="the state ConfigMap")
    job.set_defaults(handler=lambda args: main(str(args.role), str(args.state)))

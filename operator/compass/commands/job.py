"""`compass job search|profile --state NAME`: what the operator's Jobs run inside their pods.

The state ConfigMap holds the workflow spec frozen at one generation and the search ledger. The
search appends its evaluated batches' lines to the ledger at most once per FLUSH_INTERVAL_S (a
gzip chunk, compass.controllers.ledgerchunks: a PATCH carries the new lines only, and the
state's chunks move out into chunk ConfigMaps, each created once and never written again), so
a pod that is killed and retried (the Job's backoffLimit) or an operator that restarts resumes
where the last write ended: only the batches of the last few seconds and the batch in flight are
evaluated again. Results go back into the same ConfigMap for the operator to read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.api.compoundworkflow import CompoundWorkflowSpec, EvaluatorType, Profiling
from compass.console import describe_rate, describe_work_rate
from compass.controllers import kubeapi, metricsauth
from compass.controllers.builders import (
    LEDGER_KEY,
    PARTIAL_STARTED_FIELD,
    PROFILE_PARTIAL_KEY,
    PROFILE_PROGRESS_KEY,
    PROFILES_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    SPEC_KEY,
    build_ledger_chunk,
    routing_target,
    triton_address,
)
from compass.controllers.conditions import one_line
from compass.controllers.endpoints import (
    PortError,
    ready_endpoints,
    slice_entries,
)
from compass.controllers.ledgerchunks import (
    BUDGET,
    FLUSH_INTERVAL_S,
    HOT_BUDGET,
    MAX_CHUNKS,
    PENDING_TEXT,
    FlushClock,
    LedgerTooLargeError,
    chunk_key,
    chunk_name,
    config_map_size,
    decode,
    encode,
    ledger_chunks,
    ledger_text,
    pieces,
    stored_size,
    text_limit,
)
from compass.controllers.workflow_plan import ladder_budget_ms
from compass.dataplane.fleet import Endpoint
from compass.dataplane.podpool import PodPool, ProfilingTimeLimitError, TimeLimit
from compass.dataplane.profiler import (
    CurveSettings,
    ProfileSettings,
    measure_curve,
    pod_summary,
    profile_configurations,
)
from compass.dataplane.triton import GrpcTls, TritonRouter
from compass.domain.capacity import CurvePoint
from compass.domain.evaluation import Config
from compass.domain.planner import ThresholdModel, pareto_front
from compass.domain.profiles import parse_profiles
from compass.domain.search import (
    Progress,
    SearchMethod,
    SearchSettings,
    complete_feasible,
    search,
)
from compass.domain.space import Space, config_key
from compass.domain.statistics import IntervalMethod
from compass.evaluators.concurrency import ThreadRunner
from compass.evaluators.factory import ScoreSource, fleet_concurrency, make_evaluator, make_runner
from compass.evaluators.ledger import CheckpointedEvaluator, CheckpointLedger, parse_ledger

# A state read or write is retried on these answers (an API server restarting, overloaded or
# behind a proxy that lost it): a search of hours must not fail on one blip, and a pod retry
# would read the whole ledger again. Any other 4xx (a 403 of a Role without create, a 422 of a
# ConfigMap too large) fails at once with the server's reason: retrying it changes nothing.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
ATTEMPTS = 8
BACKOFF_S = 0.5  # doubling, capped: up to about 45 s of retries, an API server restart
BACKOFF_CAP_S = 15.0
_MERGE_PATCH = "application/merge-patch+json"
# The search's clock for its writes (FlushClock): a test sets its own.
monotonic = time.monotonic
# The profiling's clock for its maxSeconds, which counts across its pods' retries.
wall_clock = time.time


class StateStoreError(Exception):
    """A state read or write that still failed, transiently, after every attempt."""


class LedgerFullError(Exception):
    """The ledger would need more chunk ConfigMaps than the Jobs' Role names."""


def _transient(error: BaseException, conflict: bool) -> bool:
    if isinstance(error, ApiException):
        return error.status in TRANSIENT_STATUSES or (conflict and error.status == 409)
    return True  # no answer: refused, reset or timed out (kubeapi.ERRORS)


def _delay(attempt: int, error: BaseException) -> float:
    """Exponential backoff with jitter, at least the server's Retry-After."""
    # The jitter: the pods of many workflows must not retry in step.
    headers = getattr(error, "headers", None) or {}
    try:
        after = float(headers.get("Retry-After", 0))
    except (TypeError, ValueError):
        after = 0.0
    backoff = BACKOFF_S * 2**attempt * random.uniform(0.5, 1.0)
    return float(min(BACKOFF_CAP_S, max(after, backoff)))


@dataclass
class _Holder:
    """A chunk ConfigMap as this pod has written it: the bytes it counts towards the limit."""

    name: str
    size: int


@dataclass
class _Hot:
    """A chunk in the state itself: its batches and text (merged out with the others)."""

    first: int
    last: int
    text: str
    size: int

    @property
    def key(self) -> str:
        """Its binaryData key in the state."""
        return chunk_key(self.first, self.last)


class StateStore:
    """The state ConfigMap and its ledger chunks, each call retried on transient errors."""

    # Calls go through compass.controllers.kubeapi, so with its request timeout: a pod must
    # fail, and be retried, rather than hang on a lost API server.

    # kubeapi is imported where used, not at the top: every `compass` command imports this
    # module, and the others need no Kubernetes client (about a second to import).

    def __init__(
        self,
        name: str,
        namespace: str,
        api: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if api is None:
            api = client.CoreV1Api(kubeapi.load_client())
        self.api = api
        self.name = name
        self.namespace = namespace
        self.sleep = sleep
        self._state: dict[str, Any] | None = None
        self._opened = False  # the ledger read, so appends know where they go
        self._cold: list[_Holder] = []  # the chunk ConfigMaps, in order
        self._hot: list[_Hot] = []  # the chunks in the state, in order
        self._moved: list[str] = []  # state chunks merged out, for the next PATCH to delete
        self._next = 0  # the next batch's number

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """kubeapi.call, retried on transient errors (409 too, unless conflict=False)."""

        conflict = kwargs.pop("conflict", True)
        for attempt in range(ATTEMPTS):
            try:
                return kubeapi.call(method, *args, **kwargs)
            except kubeapi.ERRORS as error:
                if not _transient(error, conflict):
                    raise
                if attempt + 1 == ATTEMPTS:
                    raise StateStoreError(
                        f"{what}: still failing after {ATTEMPTS} attempts: "
                        f"{kubeapi.describe(error)}"
                    ) from error
                self.sleep(_delay(attempt, error))
        raise AssertionError("unreachable")

    def _get(self, name: str) -> dict[str, Any]:
        """A ConfigMap of this namespace; the server's NotFoundError if it does not exist."""
        found: dict[str, Any] = self._call(
            f"reading ConfigMap {name}", self.api.read_namespaced_config_map, name, self.namespace
        )
        return found

    def _read(self, name: str) -> dict[str, Any] | None:

        try:
            return self._get(name)
        except kubeapi.NotFoundError:
            return None

    def read(self) -> dict[str, str]:
        """The state ConfigMap's data (the server's NotFoundError, its words in the pod's last
        line, if it does not exist)."""
        found = self._get(self.name)
        self._state = found
        return dict(found.get("data") or {})

    def read_ledger(self, limit: int | None = None) -> str:
        """The ledger of the state and its chunk ConfigMaps; later appends go after it. Past
        ``limit`` bytes of text (what the workflow can record: ledgerchunks.text_limit),
        LedgerTooLargeError, with no more than that inflated (a gzip bomb in a chunk)."""
        if self._state is None:
            self.read()
        assert self._state is not None
        found = [self._state]
        # By name, one after the other until one is missing: the Role needs no list verb (and
        # names MAX_CHUNKS of them, no more).
        while len(found) <= MAX_CHUNKS and (chunk := self._read(chunk_name(self.name, len(found)))):
            found.append(chunk)
        self._cold = [_Holder(obj["metadata"]["name"], config_map_size(obj)) for obj in found[1:]]
        spans = [(first, last) for obj in found[1:] for first, last, _ in ledger_chunks(obj)]
        binary: Mapping[str, str] = self._state.get("binaryData") or {}
        self._hot, self._moved = [], []
        for first, last, value in sorted(ledger_chunks(self._state)):
            key = chunk_key(first, last)
            if any(a <= first and last <= b for a, b in spans):
                self._moved.append(key)  # merged out by a pod that died before deleting it
            else:
                try:
                    text = decode(binary[key], limit)
                except LedgerTooLargeError:
                    raise LedgerTooLargeError(
                        f"{self.name}/{key}: the ledger's text passes {limit:,} bytes"
                    ) from None
                self._hot.append(_Hot(first, last, text, stored_size(value)))
        self._next = 1 + max((span[1] for obj in found for span in ledger_chunks(obj)), default=-1)
        self._opened = True
        return ledger_text(found, limit)

    def write(self, data: Mapping[str, str | None]) -> None:
        """Patch these keys of the state, a None deleting its key (and delete the chunks
        merged out of it)."""
        self._patch(self.name, {"data": dict(data), **self._deletions()})
        self._moved = []

    def _deletions(self) -> dict[str, Any]:
        return {"binaryData": dict.fromkeys(self._moved)} if self._moved else {}

    def _patch(self, name: str, body: Mapping[str, Any]) -> None:
        self._call(
            f"patching ConfigMap {name}",
            self.api.patch_namespaced_config_map,
            name,
            self.namespace,
            body,
            _content_type=_MERGE_PATCH,
        )

    def append_ledger(self, text: str, data: Mapping[str, str] | None = None) -> None:
        """Append ledger lines, with these keys of the state: one more chunk of the state in one
        PATCH; or, once the state's chunks would pass HOT_BUDGET, they and these lines merged
        into a new chunk ConfigMap (created once, never written again), then a PATCH of the
        state that deletes them."""
        if not self._opened:
            self.read_ledger()
        value = encode(text)
        size = stored_size(value)
        body: dict[str, Any] = {}
        if sum(h.size for h in self._hot) + size > HOT_BUDGET:
            # etcd stores the whole state at every write: it keeps no more than HOT_BUDGET.
            self._merge_out(text)
        else:
            body["binaryData"] = {chunk_key(self._next): value}
            self._hot.append(_Hot(self._next, self._next, text, size))
        deletions = self._deletions().get("binaryData", {})
        if deletions:
            body["binaryData"] = {**deletions, **body.get("binaryData", {})}
        if data:
            body["data"] = dict(data)
        if body:
            self._patch(self.name, body)
        self._moved = []
        self._next += 1

    def _merge_out(self, text: str) -> None:
        """The state's chunks and ``text`` (the next batch) as one gzip in a new chunk ConfigMap:
        written once, so etcd stores it once (a chunk ConfigMap patched as it grew would be
        stored whole at every merge)."""
        # The state's chunks are deleted by the PATCH that follows: a pod that dies between the
        # two leaves them in both, and the reader skips the copy whose batches are covered.
        first = self._hot[0].first if self._hot else self._next
        merged = "".join(h.text for h in self._hot) + text
        value = encode(merged)
        if stored_size(value) <= BUDGET:
            self._create_chunk(len(self._cold) + 1, chunk_key(first, self._next), value)
        else:  # more than one ConfigMap takes: in pieces, each numbered after the last
            for number, piece in enumerate(pieces(merged)):
                key = chunk_key(first, self._next) if number == 0 else chunk_key(self._next)
                self._create_chunk(len(self._cold) + 1, key, encode(piece))
                self._next += 1
            self._next -= 1
        self._moved += [h.key for h in self._hot]
        self._hot = []

    def _create_chunk(self, index: int, key: str, value: str) -> None:
        """Create the index-th chunk ConfigMap holding this chunk."""

        assert self._state is not None
        if index > MAX_CHUNKS:
            raise LedgerFullError(
                f"the search ledger fills {MAX_CHUNKS} chunk ConfigMaps of {self.name}, the most "
                "its Role grants: search fewer samples (evaluation.samples) or a smaller space"
            )
        body = build_ledger_chunk(self._state, index, {key: value})
        name = body["metadata"]["name"]
        try:
            self._call(
                f"creating ConfigMap {name}",
                self.api.create_namespaced_config_map,
                self.namespace,
                body,
                conflict=False,
            )
        except kubeapi.ConflictError:
            existing = self._read(name)
            if existing is None:  # deleted meanwhile: create it again
                return self._create_chunk(index, key, value)
            if (existing.get("binaryData") or {}).get(key) != value:
                # Not our create answered late but another writer's ConfigMap: keep it, and
                # put this chunk after it.
                self._cold.append(_Holder(name, config_map_size(existing)))
                return self._create_chunk(index + 1, key, value)
        self._cold.append(_Holder(name, stored_size(value)))
        return None


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


def progress_document(
    progress: Progress, best: float | None, rate: str | None = None
) -> dict[str, Any]:
    """progress.json: the search's last snapshot, the best accuracy seen so far and its rate."""
    return {**progress.__dict__, "best_accuracy": best, "rate": rate}


class MirroredEvaluator:
    """Appends the checkpoint ledger's new lines to the state as batches are evaluated: at most
    once per ``interval_s`` (FlushClock), so a kill redoes at most the batches of the last
    ``interval_s`` seconds and the one in flight."""

    def __init__(
        self,
        inner: CheckpointedEvaluator,
        store: StateStore,
        ledger: Path,
        min_samples: int = 1,
        interval_s: float = FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
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
        self.flushes = FlushClock(interval_s, PENDING_TEXT)
        self.clock = clock
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
        if not self.flushes.due(self.clock()):
            return
        data = {}
        if self.progress is not None:
            best = best_accuracy(self.inner.checkpoint, self.min_samples)
            data[PROGRESS_KEY] = json.dumps(progress_document(self.progress, best, self.rate))
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
        self.flushes.written(self.clock())


def triton_tls(spec: CompoundWorkflowSpec, namespace: str, api: Any = None) -> GrpcTls | None:
    """The Jobs' TLS to Triton (spec.triton.tls), from its Secret, which the Job's Role lets it
    get by name, under the operator's Secret rules (metricsauth.triton_tls: the consent label,
    the keys, PEM); None: plaintext. CredentialsError naming the Secret, the key and the fix."""
    tls = spec.triton.tls
    if tls is None:
        return None
    core = api if api is not None else client.CoreV1Api(kubeapi.load_client())
    secret = kubeapi.read(core.read_namespaced_secret, tls.secret_ref.name, namespace)
    return metricsauth.triton_tls(tls, secret, namespace, "spec.triton.tls", "workflow")


def _score_source(spec: CompoundWorkflowSpec, namespace: str) -> ScoreSource:
    """Where the spec's evaluator takes its scores from, as the evaluator factory reads it."""
    evaluator = spec.evaluation.evaluator
    if evaluator.type is EvaluatorType.TRITON:
        workflow = {"metadata": {"namespace": namespace}}
        address = os.environ.get("COMPASS_TRITON_ADDRESS") or triton_address(workflow, spec)
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
    mirrored = MirroredEvaluator(checkpointed, store, ledger, least, FLUSH_INTERVAL_S, monotonic)

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
        method=SearchMethod(evaluation.method.value),
        interval=IntervalMethod(evaluation.interval.value),
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


def triton_pods(
    spec: CompoundWorkflowSpec, namespace: str, api: Any = None
) -> tuple[list[Endpoint], str]:
    """The Triton pods the Jobs send to (profiling measures one configuration at a time on
    each; the search spreads its requests over them), and where they came from: the operator's override (comma-separated addresses), else the ready pods of
    the Service's EndpointSlices (the addresses its Service would spread the Job's requests
    over), else the Service's one address (in another namespace, or its slices unreadable)."""
    override = os.environ.get("COMPASS_TRITON_ADDRESS")
    if override:
        addresses = list(dict.fromkeys(a.strip() for a in override.split(",") if a.strip()))
        return [Endpoint(a, a) for a in addresses], "COMPASS_TRITON_ADDRESS"
    workflow = {"metadata": {"namespace": namespace}}
    address = triton_address(workflow, spec)
    service = routing_target(workflow, spec).service
    one = [Endpoint(address, address)]
    if service is None:
        return one, f"Service {address}, in another namespace: its pods are not listed"
    try:
        slices = kubeapi.list_endpoint_slices(api or kubeapi.load_client(), namespace, service)
        pods = ready_endpoints([slice_entries(s) for s in slices], spec.triton.grpc_port, None)
    except PortError as error:
        return one, f"Service {address}: {error}"
    except kubeapi.ERRORS as error:
        reason = kubeapi.describe(error)
        return one, f"Service {address}: its EndpointSlices could not be read ({reason})"
    if not pods:
        return one, f"Service {address}: its EndpointSlices list no ready pod"
    return list(pods), f"the ready pods of Service {service}"


class ProfileReporter:
    """The profiling's progress in the state (for the workflow's status) and the Job's log, and
    its measurements so far (for a retried pod to resume from), written as each one ends."""

    def __init__(self, store: StateStore, partial: dict[str, Any], limit: TimeLimit, pods: int):
        self.store = store
        self.partial = partial
        self.limit = limit
        self.pods = pods
        self.lock = threading.Lock()
        self.phase = "latency"
        self.started = monotonic()
        self.done_at_start: int | None = None  # what this pod reused: its rate counts the rest

    def entry(self, key: str, entry: dict[str, Any]) -> None:
        """A configuration's latency measured (written with the progress that follows)."""
        self.partial.setdefault("entries", {})[key] = entry

    def curve(self, key: str, measured: dict[str, Any]) -> None:
        """A capacity curve measured (written with the progress that follows)."""
        self.partial.setdefault("curves", {})[key] = measured

    def progress(self, done: int, total: int, **extra: Any) -> None:
        """done of total in the current phase: to the state and the log."""
        with self.lock:
            if self.done_at_start is None:
                self.done_at_start = done
            unit = "curves" if self.phase == "capacity" else "configs"
            rate = describe_work_rate(
                done - self.done_at_start,
                total - self.done_at_start,
                monotonic() - self.started,
                unit,
            )
            bound = "" if self.limit.max_seconds is None else f" of {self.limit.max_seconds:g}"
            document = {
                "phase": self.phase,
                "done": done,
                "total": total,
                "pods": self.pods,
                "rate": rate,
                "elapsed_s": round(self.limit.elapsed(), 1),
                "max_seconds": self.limit.max_seconds,
                **extra,
            }
            self.store.write(
                {
                    PROFILE_PROGRESS_KEY: json.dumps(document),
                    PROFILE_PARTIAL_KEY: json.dumps(self.partial),
                }
            )
            print(
                f"profiling: {self.phase} {done}/{total} on {self.pods} pod(s), {rate}, "
                f"{self.limit.elapsed():.0f}{bound} s",
                flush=True,
            )

    def next_phase(self, phase: str) -> None:
        """The capacity curves start: their rate is their own."""
        with self.lock:
            self.phase, self.started, self.done_at_start = phase, monotonic(), None

    def stopped(self, message: str) -> None:
        """The time limit passed: the status says so, the measurements so far are kept."""
        document = {"phase": "stopped", "pods": self.pods, "message": message}
        with self.lock:
            self.store.write(
                {
                    PROFILE_PROGRESS_KEY: json.dumps(document),
                    PROFILE_PARTIAL_KEY: json.dumps(self.partial),
                }
            )


def _partial(state: Mapping[str, str]) -> dict[str, Any]:
    """The measurements an earlier pod of this profiling made (none if unreadable)."""
    try:
        partial = json.loads(state.get(PROFILE_PARTIAL_KEY) or "{}")
    except ValueError:
        return {}
    return partial if isinstance(partial, dict) else {}


def run_profile(state_name: str, namespace: str) -> int:
    """Profile the search's feasible configurations through the router, over every ready pod
    of the Service (each pod one configuration at a time); with the measured threshold model,
    then the capacity curve of each configuration on the front. Measurements already in the
    state (a pod retried) are not made again; past spec.profiling.maxSeconds it stops."""

    store = StateStore(state_name, namespace)
    state = store.read()
    spec = CompoundWorkflowSpec.model_validate_json(state[SPEC_KEY])
    result: dict[str, Any] = json.loads(state[RESULT_KEY])
    configs = [(entry["config"], entry["accuracy"]) for entry in result["feasible"]]
    pods, source = triton_pods(spec, namespace)
    tls = triton_tls(spec, namespace)
    routers = {
        pod.name: TritonRouter(pod.grpc_url, model=spec.triton.router_model, tls=tls)
        for pod in pods
    }
    partial = _partial(state)
    started = float(partial.setdefault(PARTIAL_STARTED_FIELD, wall_clock()))
    limit = TimeLimit(spec.profiling.max_seconds, "spec.profiling.maxSeconds", started, wall_clock)
    pool: PodPool[Any, Any] = PodPool(routers, limit)
    reporter = ProfileReporter(store, partial, limit, len(routers))
    known = dict(partial.get("entries") or {})
    print(
        f"profiling {len(configs)} configurations on {len(routers)} pod(s) ({source}); "
        f"{len(known)} measurements reused",
        flush=True,
    )
    size = spec.evaluation.dataset.size

    def payload(index: int) -> dict[str, Any]:
        return {"sample": index % size}

    try:
        # The status says how far it is from the start (a configuration can take minutes).
        reporter.progress(min(len(known), len(configs)), len(configs))
        document = profile_configurations(
            pool,
            configs,
            ProfileSettings(spec.profiling.warmup_runs, spec.profiling.measured_runs),
            payload,
            reporter.progress,
            known=known,
            measured=reporter.entry,
        )
        if spec.serving.threshold_model is ThresholdModel.MEASURED:
            document = _with_curves(pool, spec, document, payload, reporter)
    except ProfilingTimeLimitError as error:
        reporter.stopped(str(error))
        raise
    finally:
        for router in routers.values():
            router.close()
    document["metadata"]["pods"] = pod_summary(pool)
    done = {"phase": "done", "pods": len(routers), "elapsed_s": round(limit.elapsed(), 1)}
    store.write(
        {
            PROFILES_KEY: json.dumps(document),
            PROFILE_PROGRESS_KEY: json.dumps(done),
            PROFILE_PARTIAL_KEY: None,
        }
    )
    print(f"profiled {len(configs)} configurations in {limit.elapsed():.0f} s")
    return 0


def curve_settings(profiling: Profiling) -> CurveSettings:
    """What the spec's profiling settings ask of each capacity curve."""

    return CurveSettings(
        profiling.curve_requests_per_rate,
        profiling.curve_max_points,
        seconds_per_rate=profiling.curve_min_seconds_per_rate,
        max_seconds_per_rate=profiling.curve_max_seconds_per_rate,
        repeats_per_rate=profiling.curve_repeats_per_rate,
    )


def _with_curves(
    pool: PodPool[Any, Any],
    spec: CompoundWorkflowSpec,
    document: dict[str, Any],
    payload: Callable[[int], dict[str, Any]],
    reporter: ProfileReporter,
) -> dict[str, Any]:
    """The profiles with a capacity curve on every member of the front (the others cannot be
    served by the policy, so their curves would buy nothing): each curve measured on whichever
    pod is free, one curve a pod at a time, and named with that pod (``capacity_pod``; the
    planner's thresholds are per server, so one pod's curve is what it reads)."""

    profiles = parse_profiles(document)
    front = pareto_front(profiles, spec.slo.percentile).members
    on_front = {profile.key for profile in front}
    settings = curve_settings(spec.profiling)
    entries = document["profiles"]
    members = [
        (entry, profile)
        for entry, profile in zip(entries, profiles, strict=True)
        if profile.key in on_front
    ]
    stored: dict[str, Any] = reporter.partial.get("curves") or {}
    missing = []
    for entry, profile in members:
        key = config_key(profile.config)
        if key in stored:
            entry["capacity"], entry["capacity_pod"] = stored[key]["capacity"], stored[key]["pod"]
        else:
            missing.append((entry, profile))
    reporter.next_phase("capacity")
    done = len(members) - len(missing)
    pool.limit.done, pool.limit.total = done, len(members)
    reporter.progress(done, len(members))

    def measure(router: TritonRouter, member: tuple[dict[str, Any], Any]) -> Any:
        profile = member[1]

        def point(measured: CurvePoint) -> None:
            print(
                f"capacity of {profile.name} on {router.url}: {measured.offered_qps:.3f}/s, "
                f"p95 {measured.latency_at(95):.1f} ms",
                flush=True,
            )

        return measure_curve(
            router,
            profile.config,
            profile.mean_ms,
            spec.serving.router_instances,
            payload,
            settings,
            point,
            idle_p95_ms=profile.latency_at(95.0),
            slo_ms=ladder_budget_ms(spec),
            percentile=spec.slo.percentile,
            check=pool.limit.check,
        )

    def finished(index: int, pod: str, curve: Any) -> None:
        nonlocal done
        entry, profile = missing[index]
        entry["capacity"], entry["capacity_pod"] = curve.to_json(), pod
        reporter.curve(config_key(profile.config), {"capacity": entry["capacity"], "pod": pod})
        done += 1
        pool.limit.done = done
        drain = (
            f"drains {curve.saturation_qps:.2f}/s saturated"
            if curve.saturated
            else f"never saturated (served {curve.saturation_qps:.2f}/s, a lower bound)"
        )
        print(f"capacity of {profile.name} on {pod}: {drain}", flush=True)
        reporter.progress(done, len(members), configuration=profile.name)

    pool.run(missing, measure, finished)
    return document


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
    job.set_defaults(handler=job_command)


def job_command(args: argparse.Namespace) -> int:
    """`compass job search|profile --state NAME`."""
    return main(str(args.role), str(args.state))

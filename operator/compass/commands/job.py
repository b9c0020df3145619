"""`compass job search|profile --state NAME`: what the operator's Jobs run inside their pods.

The state ConfigMap holds the workflow spec frozen at one generation and the search ledger. The
search mirrors every evaluated batch into the ledger before asking for more, so a pod that is
killed and retried (the Job's backoffLimit) or an operator that restarts resumes exactly where
the last recorded batch ended (only the batch in flight is evaluated again). Results go back into the same
ConfigMap for the operator to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compass.api.compoundworkflow import CompoundWorkflowSpec, EvaluatorType
from compass.api.conditions import one_line
from compass.controllers.builders import (
    CURVE_PROGRESS_KEY,
    LEDGER_KEY,
    PROFILES_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    SPEC_KEY,
    triton_address,
)
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
from compass.domain.space import Space
from compass.domain.statistics import IntervalMethod
from compass.evaluators import (
    CheckpointedEvaluator,
    CheckpointLedger,
    ScoreSource,
    make_evaluator,
    parse_ledger,
)


class StateStore:
    """The state ConfigMap, read and patched through compass.controllers.kubeapi (so with its
    request timeout: a pod must fail, and be retried, rather than hang on a lost API server)."""

    # kubeapi is imported where used, not at the top: every `compass` command imports this
    # module, and the others need no Kubernetes client (about a second to import).

    def __init__(self, name: str, namespace: str) -> None:
        from kubernetes import client

        from compass.controllers import kubeapi

        self.api = client.CoreV1Api(kubeapi.load_client())
        self.name = name
        self.namespace = namespace

    def read(self) -> dict[str, str]:
        """The ConfigMap's data."""
        from compass.controllers import kubeapi

        found = kubeapi.call(self.api.read_namespaced_config_map, self.name, self.namespace)
        return dict(found.get("data") or {})

    def write(self, data: dict[str, str]) -> None:
        """Patch these keys."""
        from compass.controllers import kubeapi

        kubeapi.call(
            self.api.patch_namespaced_config_map, self.name, self.namespace, {"data": data}
        )


PROGRESS_MIN_SAMPLES = 10


def best_accuracy(checkpoint: CheckpointLedger, min_samples: int) -> float | None:
    """The highest mean score of a configuration scored on at least min_samples samples."""
    ledger = checkpoint.ledger
    means = [
        sum(scores.values()) / len(scores)
        for scores in (ledger.scores(config) for config in ledger.configs())
        if len(scores) >= min_samples
    ]
    return max(means) if means else None


def progress_document(progress: Progress, best: float | None) -> dict[str, Any]:
    """progress.json: the search's last snapshot and the best accuracy seen so far."""
    return {**progress.__dict__, "best_accuracy": best}


class MirroredEvaluator:
    """After each evaluated batch, copies the local checkpoint ledger into the ConfigMap."""

    def __init__(
        self,
        inner: CheckpointedEvaluator,
        store: StateStore,
        ledger: Path,
        min_samples: int = 1,
    ) -> None:
        self.inner = inner
        self.store = store
        self.ledger = ledger
        self.min_samples = min_samples
        self.progress: Progress | None = None

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Evaluate, then mirror the ledger (and the last progress) before returning."""
        before = self.inner.computed
        scores = self.inner.evaluate(config, sample_indices)
        if self.inner.computed != before:
            data = {LEDGER_KEY: self.ledger.read_text(encoding="utf-8")}
            if self.progress is not None:
                best = best_accuracy(self.inner.checkpoint, self.min_samples)
                data[PROGRESS_KEY] = json.dumps(progress_document(self.progress, best))
            self.store.write(data)
        return scores


def _score_source(spec: CompoundWorkflowSpec, namespace: str) -> ScoreSource:
    """Where the spec's evaluator takes its scores from, as the evaluator factory reads it."""
    evaluator = spec.evaluation.evaluator
    if evaluator.type is EvaluatorType.TRITON:
        workflow = {"metadata": {"namespace": namespace}}
        address = os.environ.get("COMPASS_TRITON_ADDRESS") or triton_address(workflow, spec)
        return ScoreSource(triton=address, router_model=spec.triton.router_model)
    if evaluator.type is EvaluatorType.COMMAND:
        assert evaluator.command
        return ScoreSource(command=evaluator.command)
    name = evaluator.replay_config_map
    assert name is not None
    recorded = StateStore(name, namespace).read().get(LEDGER_KEY, "")
    return ScoreSource(replay=parse_ledger(recorded, f"ConfigMap {name} key {LEDGER_KEY}"))


def run_search(state_name: str, namespace: str) -> int:
    """Search the frozen spec, resuming from the ledger in the state ConfigMap."""
    store = StateStore(state_name, namespace)
    state = store.read()
    spec = CompoundWorkflowSpec.model_validate_json(state[SPEC_KEY])
    space = Space(spec.space)
    workdir = Path(tempfile.mkdtemp(prefix="compass-search-"))
    ledger = workdir / LEDGER_KEY
    ledger.write_text(state.get(LEDGER_KEY, ""), encoding="utf-8")
    checkpoint = CheckpointLedger(ledger)
    if checkpoint.facts_at_open:
        print(f"resuming: {checkpoint.facts_at_open} sample evaluations already recorded")
    checkpointed = CheckpointedEvaluator(make_evaluator(_score_source(spec, namespace)), checkpoint)
    budgets = spec.evaluation.budgets
    # A mean over a handful of samples is noise: the progress's best needs some evidence.
    least = budgets[0] if budgets else min(PROGRESS_MIN_SAMPLES, spec.evaluation.dataset.size)
    mirrored = MirroredEvaluator(checkpointed, store, ledger, least)

    def progress(snapshot: Progress) -> None:
        mirrored.progress = snapshot

    evaluation = spec.evaluation
    settings = SearchSettings(
        tau=evaluation.tau,
        budgets=None if evaluation.budgets is None else tuple(evaluation.budgets),
        confidence=evaluation.confidence,
        seed=evaluation.seed,
        method=SearchMethod(evaluation.method.value),
        interval=IntervalMethod(evaluation.interval.value),
    )
    searched = search(space, mirrored, evaluation.dataset.size, settings, progress)
    # The planner orders the front by accuracy: score the feasible set on every sample.
    outcome = complete_feasible(searched, mirrored)
    result = outcome.result_document()
    store.write(
        {
            LEDGER_KEY: ledger.read_text(encoding="utf-8"),
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


def run_profile(state_name: str, namespace: str) -> int:
    """Profile the search's feasible configurations through the router; with the measured
    threshold model, then the capacity curve of each configuration on the front."""
    # Deliberately lazy: the gRPC client takes a while to load; the search Job never needs it.
    from compass.dataplane.profiler import ProfileSettings, profile_configurations
    from compass.dataplane.triton import TritonRouter

    store = StateStore(state_name, namespace)
    state = store.read()
    spec = CompoundWorkflowSpec.model_validate_json(state[SPEC_KEY])
    result: dict[str, Any] = json.loads(state[RESULT_KEY])
    configs = [(entry["config"], entry["accuracy"]) for entry in result["feasible"]]
    workflow = {"metadata": {"namespace": namespace}}
    address = os.environ.get("COMPASS_TRITON_ADDRESS") or triton_address(workflow, spec)
    router = TritonRouter(address, model=spec.triton.router_model)
    size = spec.evaluation.dataset.size

    def payload(index: int) -> dict[str, Any]:
        return {"sample": index % size}

    document = profile_configurations(
        router,
        configs,
        ProfileSettings(spec.profiling.warmup_runs, spec.profiling.measured_runs),
        payload,
    )
    if spec.serving.threshold_model is ThresholdModel.MEASURED:
        document = _with_curves(store, router, spec, document, payload)
    store.write({PROFILES_KEY: json.dumps(document)})
    print(f"profiled {len(configs)} configurations")
    return 0


def _with_curves(
    store: StateStore,
    router: Any,
    spec: CompoundWorkflowSpec,
    document: dict[str, Any],
    payload: Callable[[int], dict[str, Any]],
) -> dict[str, Any]:
    """The profiles with a capacity curve on every member of the front (the others cannot be
    served by the policy, so their curves would buy nothing)."""
    from compass.dataplane.profiler import CurveSettings, measure_curve

    profiles = parse_profiles(document)
    front = pareto_front(profiles, spec.slo.percentile).members
    on_front = {profile.key for profile in front}
    settings = CurveSettings(
        spec.profiling.curve_requests_per_rate, spec.profiling.curve_max_points
    )
    entries = document["profiles"]
    done = 0
    for entry, profile in zip(entries, profiles, strict=True):
        if profile.key not in on_front:
            continue

        def progress(point: CurvePoint, name: str = profile.name, done: int = done) -> None:
            store.write(
                {
                    CURVE_PROGRESS_KEY: json.dumps(
                        {
                            "curves_done": done,
                            "curves_total": len(front),
                            "configuration": name,
                            "offered_qps": round(point.offered_qps, 3),
                            "p95_ms": round(point.latency_at(95), 1),
                        }
                    )
                }
            )

        curve = measure_curve(
            router,
            profile.config,
            profile.mean_ms,
            spec.serving.router_instances,
            payload,
            settings,
            progress,
        )
        entry["capacity"] = curve.to_json()
        done += 1
        print(f"capacity of {profile.name}: saturates at {curve.saturation_qps:.2f}/s")
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


def register(commands: Any) -> None:
    """Add `compass job` to the `compass` parser."""
    job = commands.add_parser(
        "job",
        help="run inside the operator's Jobs (search or profile a CompoundWorkflow)",
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

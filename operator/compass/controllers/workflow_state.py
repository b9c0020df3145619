"""A generation's state ConfigMap: what it carries over, and what its Jobs wrote there."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from compass.api.compoundworkflow import CompoundWorkflowSpec, EvaluatorType
from compass.controllers.builders import (
    LEDGER_KEY,
    PARTIAL_STARTED_FIELD,
    PROFILE_PARTIAL_KEY,
    PROFILES_KEY,
    PROGRESS_KEY,
    RESULT_KEY,
    SEED_KEY,
    SPEC_KEY,
    search_name,
)
from compass.controllers.ledgerchunks import (
    CHUNK_OF_LABEL,
    MAX_CHUNKS,
    LedgerTooLargeError,
    chunk_name,
    config_map_size,
    ledger_text,
)
from compass.domain.planner import ThresholdModel

# ---------------------------------------------------------------------------- carrying state over


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scoring_key(spec: CompoundWorkflowSpec) -> str:
    """What a recorded score depends on: the dataset and who scores."""
    evaluation = spec.evaluation.model_dump(mode="json", by_alias=True)
    parts: dict[str, Any] = {k: evaluation[k] for k in ("dataset", "evaluator")}
    if spec.evaluation.evaluator.type is EvaluatorType.TRITON:
        parts["triton"] = spec.triton.model_dump(mode="json", by_alias=True)
    return _digest(parts)


def search_key(spec: CompoundWorkflowSpec) -> str:
    """What a search result depends on: the scores, the space and the search settings."""
    return _digest(
        {
            "scoring": scoring_key(spec),
            "space": spec.space.model_dump(mode="json"),
            "evaluation": spec.evaluation.model_dump(mode="json", by_alias=True),
        }
    )


def profile_key(spec: CompoundWorkflowSpec) -> str:
    """What profiles depend on: what is profiled, where and how (measured: the curves' inputs)."""
    inputs: dict[str, Any] = {
        "search": search_key(spec),
        # A bound on the profiling's time, its pod's priority and the secrets its image is
        # pulled with change nothing it measures.
        "profiling": spec.profiling.model_dump(
            mode="json",
            by_alias=True,
            exclude={"max_seconds", "priority_class_name", "image_pull_secrets"},
        ),
        "triton": spec.triton.model_dump(mode="json", by_alias=True),
    }
    if spec.serving.threshold_model is ThresholdModel.MEASURED:
        inputs["curves"] = [spec.serving.router_instances, spec.slo.percentile]
    return _digest(inputs)


@dataclass(frozen=True)
class StoredState:
    """One generation's state: its data (the whole ledger under LEDGER_KEY) and its ConfigMaps;
    ``refused``: why its ledger was not read; ``read`` False: only its names, to be deleted."""

    data: dict[str, str]
    names: tuple[str, ...]
    refused: str | None = None
    read: bool = True
    uid: str | None = None


@dataclass(frozen=True)
class StoredStates:
    """A workflow's states by generation, and the names of ConfigMaps others made under its labels
    (``foreign``) or under a state's name (``taken``): never read, never deleted."""

    states: dict[int, StoredState]
    foreign: tuple[str, ...] = ()
    taken: tuple[str, ...] = ()


class StateNameTakenError(Exception):
    """A ConfigMap the operator did not create holds the name of a state it must create."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"ConfigMap {name} has the name of this generation's state but the operator did "
            "not create it: it is not read or written over, and the generation waits; delete "
            "it and the operator creates its own"
        )
        self.name = name


def _chunk_index(name: str, state: str) -> int | None:
    """The index of ``name`` as a chunk of ``state``; None if not one of its MAX_CHUNKS names."""
    prefix = f"{state}-c"
    if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
        return None
    index = int(name[len(prefix) :])
    return index if 1 <= index <= MAX_CHUNKS and chunk_name(state, index) == name else None


def stored_states(
    items: Sequence[Mapping[str, Any]],
    workflow: str,
    generation_of: Callable[[Mapping[str, Any]], int],
    read: int | None,
    limit: int | None = None,
    fetch: Callable[[str], Mapping[str, Any] | None] | None = None,
    operators: Callable[[Mapping[str, Any]], bool] | None = None,
) -> StoredStates:
    """A workflow's state ConfigMaps by generation, each joined with its chunks; anything else
    under its labels is foreign. Only generation ``read``'s ledger is inflated, refused past
    ``limit``: whatever a tenant creates, one ledger's bound is what reading costs. ``fetch``: read
    a ConfigMap whole (``items`` are metadata only); ``operators``: whether the operator made it."""
    # Chunks whose state is gone are left to the garbage collector (they go with the workflow).
    chunks: dict[str, list[Mapping[str, Any]]] = {}
    states: dict[str, Mapping[str, Any]] = {}
    candidates = []
    foreign = []
    taken = []
    for item in items:
        name = item["metadata"]["name"]
        of = (item["metadata"].get("labels") or {}).get(CHUNK_OF_LABEL)
        if of is None and name == search_name(workflow, generation_of(item)):
            if operators is None or operators(item):
                states[name] = item
            else:
                taken.append(name)
        elif of is not None and _chunk_index(name, of) is not None:
            candidates.append((of, item))
        else:
            foreign.append(name)
    for of, item in candidates:
        if of in states:
            chunks.setdefault(of, []).append(item)
        else:
            foreign.append(item["metadata"]["name"])
    found = {}
    for name, state in states.items():
        generation = generation_of(state)
        mine = chunks.get(name, [])
        names = (name, *sorted(c["metadata"]["name"] for c in mine))
        uid = state["metadata"].get("uid")
        if generation != read:
            found[generation] = StoredState({}, names, read=False, uid=uid)
            continue
        objects, refused = [state, *mine], None
        if fetch is not None:
            objects, refused = _fetched(names, fetch, limit)
        whole = next((o for o in objects if o["metadata"]["name"] == name), {})
        data = {k: v for k, v in (whole.get("data") or {}).items() if k != LEDGER_KEY}
        if refused is None:
            try:
                data[LEDGER_KEY] = ledger_text(objects, limit)
            except LedgerTooLargeError as error:
                refused = str(error)
        found[generation] = StoredState(data, names, refused=refused, uid=uid)
    return StoredStates(found, tuple(sorted(foreign)), tuple(sorted(taken)))


# What a state's own keys (its spec, result, profiles) may add to its ledger's bytes.
_STATE_ROOM = 1024 * 1024


def _fetched(
    names: Sequence[str], fetch: Callable[[str], Mapping[str, Any] | None], limit: int | None
) -> tuple[list[Mapping[str, Any]], str | None]:
    """One state's ConfigMaps read whole, one at a time, stopping past ``limit`` bytes stored
    (gzip stores a text in little more than its length: the ledger is past it too)."""
    objects: list[Mapping[str, Any]] = []
    stored = 0
    for name in names:
        obj = fetch(name)
        if obj is None:
            continue  # deleted since the listing: the ledger is read without it
        stored += config_map_size(obj)
        objects.append(obj)
        if limit is not None and stored > limit + _STATE_ROOM:
            return objects[:1], f"{name}: its ConfigMaps store more than {limit:,} bytes"
    return objects, None


def state_recogniser(
    recorded: str | None, recorded_uid: str | None, created: Collection[str]
) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a ConfigMap of a state's name is the operator's: its uid is the recorded one or one
    this process made (the name alone is no proof, but for a status from before uids)."""

    def mine(item: Mapping[str, Any]) -> bool:
        metadata = item["metadata"]
        uid = metadata.get("uid")
        if uid is not None and (uid in created or uid == recorded_uid):
            return True
        return recorded_uid is None and recorded is not None and metadata["name"] == recorded

    return mine


def state_to_read(
    names: Sequence[str], workflow: str, generation: int, recorded: str | None
) -> int | None:
    """The generation whose ledger a start reads: its own, else the earlier one the status names."""
    if search_name(workflow, generation) in names:
        return generation
    _, _, suffix = (recorded or "").rpartition("-g")
    earlier = int(suffix) if suffix.isdigit() else None
    if earlier is not None and 0 < earlier < generation and recorded in names:
        return earlier if recorded == search_name(workflow, earlier) else None
    return None


def refusal_message(workflow: str, listing: StoredStates) -> str | None:
    """What was refused of a workflow's states, naming the ConfigMaps and why; None: nothing."""
    parts = []
    for generation, state in sorted(listing.states.items()):
        if state.refused is not None:
            parts.append(
                f"the ledger of generation {generation} ({state.names[0]}) is not carried over: "
                f"{state.refused}, past what the workflow or the operator's ledgerTextLimitMiB "
                "allows"
            )
    if listing.foreign:
        shown = ", ".join(listing.foreign[:5])
        more = f" and {len(listing.foreign) - 5} more" if len(listing.foreign) > 5 else ""
        parts.append(
            f"ConfigMaps {shown}{more} carry this workflow's labels but not the names the "
            f"operator gives its states ({search_name(workflow, 1)} and its -c<N> chunks, one "
            "generation each): not read; delete them"
        )
    if listing.taken:
        parts.append(
            f"ConfigMaps {', '.join(listing.taken[:5])} carry the names of this workflow's "
            "states but the operator did not create them (their uids are not the ones it "
            "recorded): not read; delete them"
        )
    return "; ".join(parts) or None


def seedable(states: Mapping[int, StoredState]) -> dict[int, dict[str, str]]:
    """The states a new generation may start from: read and not refused (no gzip bomb copied)."""
    return {g: s.data for g, s in states.items() if s.read and s.refused is None}


def ledger_facts(state: Mapping[str, str]) -> int:
    """The ledger's recorded lines (batches of sample evaluations) in a state's data."""
    return sum(1 for line in state.get(LEDGER_KEY, "").splitlines() if line.strip())


def seed_state(
    spec: CompoundWorkflowSpec, generation: int, previous: Mapping[int, Mapping[str, str]]
) -> dict[str, str]:
    """Carry over from the newest earlier generation whose scores hold: its ledger, its result while
    the search is unchanged, its profiles (or partial profiling) while the profiling is too."""
    for earlier in sorted((g for g in previous if g < generation), reverse=True):
        data = previous[earlier]
        try:
            old = CompoundWorkflowSpec.model_validate_json(data.get(SPEC_KEY, ""))
        except ValidationError:
            continue
        if scoring_key(old) != scoring_key(spec):
            continue
        seed: dict[str, str] = {LEDGER_KEY: data.get(LEDGER_KEY, "")}
        result_from = profiles_from = None
        if search_key(old) == search_key(spec) and data.get(RESULT_KEY):
            seed[RESULT_KEY] = data[RESULT_KEY]
            if data.get(PROGRESS_KEY):
                seed[PROGRESS_KEY] = data[PROGRESS_KEY]
            result_from = earlier
            if profile_key(old) == profile_key(spec) and data.get(PROFILES_KEY):
                seed[PROFILES_KEY] = data[PROFILES_KEY]
                profiles_from = earlier
            elif profile_key(old) == profile_key(spec) and data.get(PROFILE_PARTIAL_KEY):
                partial = restarted_partial(data[PROFILE_PARTIAL_KEY])
                if partial is not None:
                    seed[PROFILE_PARTIAL_KEY] = partial
        origin = {"ledger": earlier, "result": result_from, "profiles": profiles_from}
        seed[SEED_KEY] = json.dumps(origin, sort_keys=True)
        return seed
    return {}


def restarted_partial(text: str) -> str | None:
    """An earlier partial profiling for a new generation, its bound restarted; None: unreadable."""
    try:
        partial = json.loads(text)
    except ValueError:
        return None
    if not isinstance(partial, dict):
        return None
    partial.pop(PARTIAL_STARTED_FIELD, None)
    return json.dumps(partial)


def seed_origin(state: Mapping[str, str]) -> dict[str, int | None]:
    """Which generation the state's ledger, result and profiles came from (None: its own)."""
    try:
        origin = json.loads(state.get(SEED_KEY) or "{}")
    except ValueError:
        origin = {}
    return {k: origin.get(k) for k in ("ledger", "result", "profiles")}


# ---------------------------------------------------------------------------- counts and results


def state_json(state: Mapping[str, str], key: str) -> Any:
    """The JSON a Job wrote under ``key``; None when absent or unreadable."""
    text = state.get(key)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def state_counts(state: Mapping[str, str]) -> dict[str, Any]:
    """The status's counts from the result (once there) or the last progress snapshot."""
    result = state_json(state, RESULT_KEY)
    if isinstance(result, dict):
        evaluated = result.get("evaluated") or []
        best = max((float(e["accuracy"]) for e in evaluated), default=None)
        return {
            "configurations_evaluated": int(result.get("configs_evaluated", len(evaluated))),
            "samples_used": int(result.get("sample_evals", 0)),
            "feasible_found": len(result.get("feasible") or []),
            "best_accuracy": None if best is None else round(best, 4),
            "search_rate": None,
        }
    progress = state_json(state, PROGRESS_KEY)
    if not isinstance(progress, dict):
        progress = {}  # nothing recorded yet: every count 0
    best = progress.get("best_accuracy")
    return {
        "configurations_evaluated": int(progress.get("configs_evaluated", 0)),
        "samples_used": int(progress.get("sample_evals", 0)),
        "feasible_found": int(progress.get("feasible", 0)),
        "best_accuracy": None if best is None else round(float(best), 4),
        "search_rate": job_text(progress.get("rate"), 80),
    }


def job_text(value: object, limit: int) -> str | None:
    """A text a Job wrote, bounded to ``limit`` (the state is the Job's to write, not ours)."""
    return value[:limit] if isinstance(value, str) else None


def feasible_set_empty_message(result: Mapping[str, Any], tau: float) -> str:
    """Why no configuration qualifies: the best accuracy reached and a tau that would work."""
    evaluated = list(result.get("evaluated") or [])
    if not evaluated:
        return (
            f"no configuration reaches tau {tau:g}: the search evaluated none; check the "
            f"evaluator and the dataset"
        )
    best = max(evaluated, key=lambda e: float(e["accuracy"]))
    accuracy = float(best["accuracy"])
    workable = math.floor(accuracy * 100) / 100
    name = "/".join(str(v) for v in best["config"].values())  # as the planner names it
    return (
        f"no configuration reaches tau {tau:g}: the best accuracy reached is {accuracy:.3f} "
        f"({name} on {best.get('samples', '?')} samples, "
        f"{len(evaluated)} configurations evaluated); set evaluation.tau to {workable:.2f} or "
        f"lower, or widen the space"
    )

"""Late binding's table and its decision: each stage of a request bound, when the pipeline
reaches it, to the most accurate allowed configuration consistent with what is bound whose
remaining time fits what is left of its deadline (docs/serving.md, "Late binding").

The table is the form a router decides on (``check_binding`` makes it from what a switch sends,
``decision_table`` from the domain's plan): per configuration its values, accuracy and
per-stage times, and the same as numpy arrays, read at every stage bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from compass_rules.routing import config_key

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# A table travels in a ParetoPolicy and to every router: bounded like a front's capacity curve.
MAX_BINDING_CONFIGS = 128
MAX_STAGES = 8
# Pipelines a pod runs at once (the routers' gate, compass_pipeline_slots), and how many times
# its own time a request may take with all of them running (more is a unit mistake).
MAX_SLOTS = 1024
MAX_STRETCH = 1024.0
# The longest settle at a free pipeline (behind the router's gate) a table may ask.
MAX_SETTLE_MS = 100.0
# A pod's arrival rate (what a table's rate limits are judged against) is counted over this
# window, s, by the router's gate and by the simulator's bound pods (2 s saw bursts sooner than
# 5 s and kept more requests in time on bench/serving_sim.py).
RATE_WINDOW_S = 2.0
# A follower whose deadline its work ahead meets within this, ms, counts as in time: the stage
# times are a least-squares fit whose last bits vary with the machine's LAPACK, and deadlines
# are differences of float seconds, so an exact tie must not turn on rounding.
ROUNDING_MS = 1e-6
# How a stage was bound (compass.domain.binding.BindingVerdict has the same values): the most
# accurate that fits; none fits, so the fastest completion; late whatever serves it, refused.
FITS, FASTEST, REFUSED = "fits", "fastest", "refused"

# One configuration as a table holds it: its values, accuracy, per-stage times (at the plan's
# quantile, then at admission's) and the arrival rate above which the slow loop disallows it.
Entry = tuple[Mapping[str, Any], float, Sequence[float], Sequence[float], float | None]


def decision_table(
    stages: Sequence[Sequence[str]],
    configs: Sequence[Entry],
    slots: int = 1,
    stretch: Sequence[float] | None = None,
) -> dict[str, Any]:
    """What a decision reads: the stages, each parameter's stage, the configurations and their
    numbers as arrays (``arrays``: per-stage times, admission's, each parameter's values, the
    fastest configuration and its total times, each one's total and accuracy, and each one's
    ``stretch`` with all ``slots`` pipelines of the pod running: see ``at_concurrency``)."""
    stage_ms = np.array([entry[2] for entry in configs], dtype=float).reshape(len(configs), -1)
    admit_ms = np.array([entry[3] for entry in configs], dtype=float).reshape(len(configs), -1)
    names = [n for s in stages for n in s]
    fastest = int(np.argmin([sum(entry[2]) for entry in configs]))
    arrays = {
        "stage_ms": stage_ms,
        "admit_ms": admit_ms,
        "values": {n: np.array([entry[0][n] for entry in configs], dtype=object) for n in names},
        "fastest_ms": (sum(configs[fastest][2]), sum(configs[fastest][3])),
        "fastest": fastest,
        "total_ms": stage_ms.sum(axis=1),
        "accuracy": np.array([entry[1] for entry in configs], dtype=float),
        "stretch": np.ones(len(configs)) if stretch is None else np.array(stretch, dtype=float),
    }
    return {
        "stages": [list(s) for s in stages],
        "stage_of": {n: i for i, s in enumerate(stages) for n in s},
        "configs": list(configs),
        "max_qps": [entry[4] for entry in configs],
        "arrays": arrays,
        "slots": slots,
        # at_concurrency's tables, by the pipelines running.
        "at": {},
    }


def concurrency_factor(stretch: FloatArray, running: int, slots: int) -> FloatArray:
    """How many times its own time a request takes with ``running`` pipelines in the pod
    (itself included) of its ``slots``: 1 alone, each configuration's ``stretch`` with every
    slot busy, linear between (the contended pod model, compass.domain.podmodel.PodModel)."""
    if slots <= 1:
        return np.ones_like(stretch)
    share = (min(max(running, 1), slots) - 1) / (slots - 1)
    result: FloatArray = 1 + (stretch - 1) * share
    return result


def at_concurrency(table: Mapping[str, Any], running: int) -> Mapping[str, Any]:
    """The table as a request judges it with ``running`` pipelines in the pod (itself
    included): every configuration's times x its ``concurrency_factor``, so the rules that read
    the table (deadlines, followers, the lag cap) see the time it takes sharing the pod. A table
    of one slot is itself; one of several, made once per count."""
    slots = table.get("slots", 1)
    if slots <= 1:
        return table
    running = min(max(running, 1), slots)
    made: dict[int, Mapping[str, Any]] = table["at"]
    if running in made:
        return made[running]
    arrays = table["arrays"]
    factor = concurrency_factor(arrays["stretch"], running, slots)[:, None]
    stage_ms, admit_ms = arrays["stage_ms"] * factor, arrays["admit_ms"] * factor
    total_ms = stage_ms.sum(axis=1)
    fastest = int(np.argmin(total_ms))
    made[running] = {
        **table,
        "arrays": {
            **arrays,
            "stage_ms": stage_ms,
            "admit_ms": admit_ms,
            "total_ms": total_ms,
            "fastest": fastest,
            "fastest_ms": (float(total_ms[fastest]), float(admit_ms[fastest].sum())),
        },
    }
    return made[running]


def pipeline_view(
    table: Mapping[str, Any], running: int, backlog_ms: Sequence[float]
) -> tuple[Mapping[str, Any], Sequence[float]]:
    """What a request binding with ``running`` pipelines in the pod judges on: the table at that
    concurrency and the work queued ahead at each component, which with several slots is none
    (the pipelines share the components, and the stretch is that sharing: counting their work
    as a queue too would count it twice)."""
    if table.get("slots", 1) <= 1:
        return table, backlog_ms
    return at_concurrency(table, running), [0.0] * len(backlog_ms)


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _share_of_slo(table: Mapping[str, Any], name: str, slo_ms: float | None) -> float | None:
    """The table's ``name``: a share of its ``slo_ms`` in (0, 1], or None where absent."""
    share = table.get(name)
    if share is not None and (not _number(share) or not 0 < share <= 1 or slo_ms is None):
        raise ValueError(f"binding: {name} {share!r} is not a share of slo_ms in (0, 1] (or null)")
    return None if share is None else float(share)


def _stage_models(stages: list[Any], components: Any) -> list[list[str]]:
    """Each stage's component models, checked: a model name or a list of them a stage; the only
    stage of a table may have none (``[[]]``: the whole configuration is one stage, bound at
    take-up)."""
    if not isinstance(components, list) or len(components) != len(stages):
        raise ValueError("binding: components must name one model per stage")
    # A stage may call several models (a list): each call of one counts as that stage's.
    models = [[c] if isinstance(c, str) else c for c in components]
    whole = len(models) == 1 and models[0] == []
    if not whole and not all(
        isinstance(m, list) and m and all(isinstance(n, str) and n for n in m) for m in models
    ):
        raise ValueError(
            "binding: each stage's component is a model name or a list of them (an empty list "
            "only where the table has one stage: the configuration bound whole at take-up)"
        )
    named = [n for m in models for n in m]
    if len(set(named)) != len(named):
        raise ValueError("binding: a component model belongs to two stages")
    return models


def _entry(entry: Any, names: list[str], stages: int) -> Entry:
    """One configuration of a table as sent, checked."""
    config = json.loads(config_key(json.loads(entry["config"])))
    if set(config) != set(names):
        raise ValueError(f"binding: {entry['config']} does not set exactly {sorted(names)}")
    times = {}
    for field in ("stage_ms", "stage_admit_ms"):
        values = entry.get(field, entry.get("stage_ms"))
        if (
            not isinstance(values, list)
            or len(values) != stages
            or not all(_number(v) and 0 <= v < math.inf for v in values)
        ):
            raise ValueError(f"binding: {field} of {entry['config']} is not one ms >= 0 per stage")
        times[field] = [float(v) for v in values]
    accuracy = entry.get("accuracy")
    if not _number(accuracy):
        raise ValueError(f"binding: accuracy of {entry['config']} is not a number")
    limit = entry.get("max_qps")
    if limit is not None and (not _number(limit) or not limit >= 0):
        raise ValueError(f"binding: max_qps of {entry['config']} is not a rate >= 0 (or null)")
    return (
        config,
        float(accuracy),
        times["stage_ms"],
        times["stage_admit_ms"],
        None if limit is None else float(limit),
    )


def check_binding(table: Any) -> dict[str, Any]:
    """The binding table as a switch sends it (compass.domain.binding.router_table), checked
    and made ready to decide on (``decision_table`` and the table's settings)."""
    if not isinstance(table, dict):
        raise ValueError(
            "binding: give {'stages': [[param]], 'components': [model], 'configs': [...]}"
        )
    stages, configs = table.get("stages"), table.get("configs")
    if not isinstance(stages, list) or not 1 <= len(stages) <= MAX_STAGES:
        raise ValueError(f"binding: stages must be 1 to {MAX_STAGES} lists of parameters")
    if not all(isinstance(s, list) and all(isinstance(n, str) for n in s) for s in stages):
        raise ValueError("binding: each stage is a list of parameter names")
    names = [n for s in stages for n in s]
    if len(set(names)) != len(names):
        raise ValueError("binding: a parameter is bound by two stages")
    models = _stage_models(stages, table.get("components"))
    if not isinstance(configs, list) or not 1 <= len(configs) <= MAX_BINDING_CONFIGS:
        raise ValueError(f"binding: configs must hold 1 to {MAX_BINDING_CONFIGS} configurations")
    checked = [_entry(entry, names, len(stages)) for entry in configs]
    slots = table.get("slots", 1)
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
        raise ValueError(f"binding: slots {slots!r} is not a count of pipelines in 1..{MAX_SLOTS}")
    stretch = [entry.get("stretch", 1.0) for entry in configs]
    if not all(_number(s) and 1 <= s <= MAX_STRETCH for s in stretch):
        raise ValueError(
            f"binding: a stretch of {stretch} is not a factor in [1, {MAX_STRETCH:g}] "
            "(a configuration's time with every slot busy over its time alone)"
        )
    refuse = table.get("refuse", False)
    if not isinstance(refuse, bool):
        raise ValueError(f"binding: refuse {refuse!r} is not true or false")
    slo_ms = table.get("slo_ms")
    if slo_ms is not None and (not _number(slo_ms) or not 0 < slo_ms < 1e12):
        raise ValueError(f"binding: slo_ms {slo_ms!r} is not a time in ms > 0 (or null)")
    degrade_after = _share_of_slo(table, "degrade_after", slo_ms)
    lag_share = _share_of_slo(table, "lag_share", slo_ms)
    lag_reserve = table.get("lag_reserve", 0)
    if isinstance(lag_reserve, bool) or not isinstance(lag_reserve, int) or lag_reserve < 0:
        raise ValueError(f"binding: lag_reserve {lag_reserve!r} is not a count >= 0")
    settle_ms = table.get("settle_ms", 0.0)
    if not _number(settle_ms) or not 0 <= settle_ms <= MAX_SETTLE_MS:
        raise ValueError(
            f"binding: settle_ms {settle_ms!r} is not a time in [0, {MAX_SETTLE_MS}] ms"
        )
    return {
        **decision_table(stages, checked, slots, [float(s) for s in stretch]),
        "components": table["components"],
        "stage_of_model": {n: i for i, m in enumerate(models) for n in m},
        # One stage calling no model: bound at take-up, at stage 0 until its run ends.
        "whole": models == [[]],
        "refuse": refuse,
        "slo_ms": None if slo_ms is None else float(slo_ms),
        "degrade_after": degrade_after,
        "lag_share": lag_share,
        "lag_reserve": lag_reserve,
        "settle_ms": float(settle_ms),
    }


def allowed_at(max_qps: Sequence[float | None], qps: float) -> list[int]:
    """The configurations whose rate limit (None: none) a pod's arrival rate is within."""
    return [i for i, limit in enumerate(max_qps) if limit is None or qps <= limit]


def remaining_ms(stage_ms: Sequence[float], at: int, backlog_ms: Sequence[float]) -> float:
    """A configuration's time from stage ``at`` to the end: at each remaining component, the
    work ahead there plus its own time (``consistent_remaining_ms`` for a whole table)."""
    return sum(backlog_ms[s] + stage_ms[s] for s in range(at, len(stage_ms)))


def consistent_remaining_ms(
    table: Mapping[str, Any],
    bound: Mapping[str, Any],
    at: int,
    backlog_ms: Sequence[float],
    times: str = "stage_ms",
    known: dict[str, tuple[BoolArray, FloatArray]] | None = None,
) -> tuple[BoolArray, FloatArray]:
    """Which configurations agree with ``bound``, and each one's remaining time from stage
    ``at`` (summed as ``remaining_ms`` sums), on the table's ``times`` (``stage_ms`` or, likely,
    ``admit_ms``) arrays: a router reads these at every stage it binds, and the decision must
    stay well under a ms. ``known``: a dict that keeps them for one decision (the same request,
    stage and backlog), so the rules it applies read them once; neither array is to be changed."""
    if known is not None and times in known:
        return known[times]
    arrays = table["arrays"]
    consistent = np.ones(len(table["configs"]), dtype=bool)
    for name, value in bound.items():
        consistent &= arrays["values"][name] == value
    matrix = arrays[times]
    total = np.zeros(len(matrix))
    for stage in range(at, matrix.shape[1]):
        total = total + (backlog_ms[stage] + matrix[:, stage])
    if known is not None:
        known[times] = consistent, total
    return consistent, total


def quickest_remaining_ms(
    table: Mapping[str, Any],
    bound: Mapping[str, Any],
    at: int,
    backlog_ms: Sequence[float],
    times: str = "stage_ms",
    known: dict[str, tuple[BoolArray, FloatArray]] | None = None,
) -> float:
    """The quickest remaining time from stage ``at`` among the configurations consistent with
    ``bound`` (all where none is)."""
    consistent, total = consistent_remaining_ms(table, bound, at, backlog_ms, times, known)
    return float(total[consistent].min() if consistent.any() else total.min())


def bind_stage(
    table: Mapping[str, Any],
    stage: int,
    bound: Mapping[str, Any],
    left_ms: float,
    backlog_ms: Sequence[float],
    allowed: Collection[int] | None = None,
    at: int | None = None,
    spare_ms: float = math.inf,
    refuse: bool = False,
    known: dict[str, tuple[BoolArray, FloatArray]] | None = None,
) -> tuple[int | None, str, float]:
    """Bind ``stage``: (the configuration the request heads for, None where refused; how:
    FITS, FASTEST or REFUSED; its remaining time, ms, likely where refused).

    Among the configurations consistent with ``bound``, the most accurate (among equals the
    fastest) whose remaining time from stage ``at`` (None: ``stage``; earlier where a pipeline
    reads a later stage's parameters first) fits ``left_ms`` and is at most ``spare_ms`` longer
    than the fastest completion (the requests waiting behind it; 0: it waited long), of those
    ``allowed`` (the slow loop's; None all; the fastest completion always); else the fastest
    completion (among equals the most accurate); refused where ``refuse`` and even its likely
    time (admission's quantile) is past ``left_ms``. ``known``:
    consistent_remaining_ms' memo for this decision."""
    at = stage if at is None else at
    consistent, times = consistent_remaining_ms(table, bound, at, backlog_ms, known=known)
    if not consistent.any():
        raise ValueError(f"binding: no allowed configuration has {dict(bound)}")
    accuracy = table["arrays"]["accuracy"]
    candidates = np.flatnonzero(consistent)
    # Fastest completion; among equals the most accurate (the first such, as min() takes).
    fastest = int(candidates[np.lexsort((-accuracy[candidates], times[candidates]))[0]])
    fitting = consistent & (times <= left_ms) & (times - times[fastest] <= max(spare_ms, 0.0))
    if allowed is not None:
        permitted = np.zeros(len(times), dtype=bool)
        permitted[list(allowed)] = True
        permitted[fastest] = True
        fitting &= permitted
    if fitting.any():
        # Most accurate; among equals the fastest (the first such, as max() takes).
        chosen = np.flatnonzero(fitting)
        best = int(chosen[np.lexsort((times[chosen], -accuracy[chosen]))[0]])
        return best, FITS, float(times[best])
    if refuse:
        _, admit = consistent_remaining_ms(table, bound, at, backlog_ms, "admit_ms", known)
        likely = float(admit[consistent].min())
        if likely > left_ms:
            return None, REFUSED, likely
    return fastest, FASTEST, float(times[fastest])


def waited_long(waited_ms: float, slo_ms: float, degrade_after: float) -> bool:
    """Whether a request that waited ``waited_ms`` for a router instance binds the fastest
    completion: over ``degrade_after`` of the SLO, a queue stands behind it (admission's
    degradeAfter), which a router behind Triton's scheduler cannot see otherwise."""
    return waited_ms > degrade_after * slo_ms

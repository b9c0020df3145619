"""A digest of the simulator's outputs on fixed seeds: the floor that a refactor keeps behaviour.

Serves the paper's front, planned for one SLO, on a bursty pattern with fixed seeds, through
compass.conversion as the operator and the CLI build the serving: the static baselines, each
whole-workflow strategy (with and without admission, on stale metrics, on staged pods), and
per-request binding (at take-up, declared stages, with and without admission and the lag cap).
Prints one line per run: its label and a digest of every request's start, finish and serving
configuration, of the policy's decisions tick by tick, and of its headline figures. Run it
before and after a change to the simulator; the lines must match or each difference be explained.

    .venv/bin/python bench/sim_fingerprint.py [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compass.api.paretopolicy import ServingSettings
from compass.conversion import simulate_serving, spec_for_plan
from compass.domain.arrivals import PatternKind, make_pattern, make_scenario
from compass.domain.planner import Slo, plan_from_profiles
from compass.domain.podmodel import RAG_SIM_STAGES, PodModel
from compass.domain.profiles import parse_profiles
from compass.domain.simulator import MetricsView, RunReport, StaticController, simulate

PAPER_PROFILES = Path(__file__).parent / "data" / "compass-paper" / "planner_latency_profiles.json"
SLO_MS = 1000.0
RAG_STAGES = [
    {"component": "retriever", "parameters": ["retriever_k"], "share": 0.1},
    {"component": "reranker", "parameters": ["reranker_model", "reranker_k"], "share": 0.2},
    {"component": "generator", "parameters": ["generator_model"], "share": 0.7},
]
WORKFLOW = {"mode": "workflow"}
# Each run: its spec fields, and the simulate_serving keywords beside them.
RUNS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "static-fastest": ({"binding": WORKFLOW}, {"static": 0}),
    "static-accurate": ({"binding": WORKFLOW}, {"static": -1}),
    "elastico": ({"binding": WORKFLOW}, {}),
    "elastico-2pods-stale": (
        {"binding": WORKFLOW},
        {"pods": 2, "metrics_view": MetricsView(scrape_interval_s=2.0, lag_s=0.5)},
    ),
    "predictive": ({"binding": WORKFLOW, "strategy": "predictive"}, {}),
    "predictive+admission": (
        {"binding": WORKFLOW, "strategy": "predictive", "admission": {"enabled": True}},
        {},
    ),
    "split": ({"binding": WORKFLOW, "strategy": "split"}, {}),
    "elastico-staged-pod": ({"binding": WORKFLOW}, {"pod_model": PodModel(1, RAG_SIM_STAGES)}),
    "binding": ({}, {}),
    "binding-2pods": ({}, {"pods": 2}),
    "binding-no-admission": ({"admission": {"enabled": False}}, {}),
    "binding-no-lag-cap": ({"binding": {"lagShare": None}}, {}),
    "binding-stages": ({"binding": {"stages": RAG_STAGES}}, {}),
    "binding-stages-no-admission": (
        {"binding": {"stages": RAG_STAGES}, "admission": {"enabled": False}},
        {},
    ),
}


def digest(*arrays: Any) -> str:
    """A short hash of the values, rounded to ns so that only real changes show."""
    hasher = hashlib.sha256()
    for array in arrays:
        hasher.update(np.round(np.asarray(array, dtype=np.float64), 9).tobytes())
    return hasher.hexdigest()[:16]


def line(label: str, report: RunReport) -> str:
    """One run's fingerprint."""
    requests = digest(report.starts_s, report.finishes_s, report.configs)
    ticks = hashlib.sha256(
        json.dumps(
            [(t.time_s, t.active, t.switched, str(t.mix), t.queue_depth) for t in report.ticks]
            + [list(r) for r in report.reasons]
        ).encode()
    ).hexdigest()[:16]
    summary = report.summary()
    head = (
        f"compliance={summary['slo_compliance_pct']:.6f} accuracy={summary['mean_accuracy']:.6f} "
        f"dropped={summary['dropped_pct']:.6f} switches={report.switches}"
    )
    return f"{label:28} requests={requests} ticks={ticks} {head}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print every run's fingerprint on every seed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    args = parser.parse_args(argv)
    profiles = parse_profiles(json.loads(PAPER_PROFILES.read_text(encoding="utf-8")))
    plan = plan_from_profiles(profiles, Slo(SLO_MS), 50.0)
    fastest_ms = plan.thresholds[0].profile.mean_ms
    for seed in (int(s) for s in args.seeds.split(",")):
        pattern = make_pattern(PatternKind.BURSTY, 0.5 * 1000 / fastest_ms, 300.0, seed=seed)
        scenario = make_scenario(pattern, seed)
        for label, (fields, options) in RUNS.items():
            options = dict(options)
            static = options.pop("static", None)
            if static is not None:
                front = [t.profile for t in plan.thresholds]
                index = static % len(front)
                controller = StaticController(front[index].name, index)
                report = simulate(controller, front, scenario, SLO_MS, label, **options)
            else:
                spec = spec_for_plan(plan, serving=ServingSettings.model_validate(fields))
                report = simulate_serving(spec, scenario, label, **options)
            print(f"seed {seed} {line(label, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

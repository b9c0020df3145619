"""Write rag-sim's data file from the paper's measurements (run when the data or the model change).

    python hack/gen_rag_sim.py [--data bench/data/compass-paper] [--output PATH]

Per configuration of the RAG grid (234): its per-question scores (the embedded replay ledger,
so searching rag-sim through Triton sees exactly what `compass demo` replays) and its latency
quantile function; per stage (retriever, reranker), its time for its own parameters. The 79 configurations the paper profiled use their own measured
distribution (fitted by compass.domain.profiles, exactly as the simulator draws service
times, so a live run and a simulated one serve the same requests alike); the others, which the paper never timed because they miss tau = 0.75, get one
predicted by a log-additive model fitted on the 79 (generator + retriever_k + reranker_k +
reranker_model), with the profiled configurations' average shape.

Each component serves its own stage's time, so that a stage's parameters matter only at that
stage's call (the router binds them there): the retriever's time for ``retriever_k`` and the
reranker's for its model and k are their shares (0.1, 0.2) of the quantile function of the
quickest configuration that shares those parameters (quantile by quantile); the generator, last,
serves the rest of the configuration's time (so at least 0.7 of it). A configuration's stages add up to its latency quantile by quantile, so
the end-to-end distribution is the one above.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from compass.domain.profiles import parse_profile
from compass.domain.space import Space, config_key
from compass.examples import RAG_PAPER_SAMPLES, build_replay_ledger, load_rag_paper

REPO_ROOT = Path(__file__).resolve().parents[1]

DEFAULT_DATA = REPO_ROOT / "bench" / "data" / "compass-paper"
DEFAULT_OUTPUT = REPO_ROOT / "model-images" / "rag-sim" / "models" / "rag_sim.json"
LEDGER_SEED = 0  # the demo's replay seed (compass.commands.demo.DEMO_LEDGER_SEED)
# Midpoints of 201 equal-probability bins: the fitted distributions have unbounded tails, so the
# quantile function is tabulated inside (0, 1); a request's luck outside [0.0025, 0.9975] is
# served at the end values.
GRID = (np.arange(201) + 0.5) / 201
# The stages before the last, each with the parameters its time depends on and its share of
# the quickest time among the configurations that share them (of every one's time, so the
# last stage's rest is never negative); the last stage serves the rest.
EARLY_STAGES = (
    ("retriever", ("retriever_k",), 0.1),
    ("reranker", ("reranker_model", "reranker_k"), 0.2),
)
LAST_STAGE = ("generator", ("generator_model",))


def stage_tables(configs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each stage's quantile function per value of its own parameters (the last: none, it
    serves the rest of its configuration's time)."""
    tables: list[dict[str, Any]] = []
    for component, names, share in EARLY_STAGES:
        groups: dict[str, list[np.ndarray]] = {}
        for key, entry in configs.items():
            own = config_key({name: json.loads(key)[name] for name in names})
            groups.setdefault(own, []).append(np.asarray(entry["latency_quantiles_ms"]))
        quantiles = {
            own: [round(float(q), 3) for q in share * np.min(rows, axis=0)]
            for own, rows in sorted(groups.items())
        }
        tables.append(
            {"component": component, "parameters": list(names), "quantiles_ms": quantiles}
        )
    component, names = LAST_STAGE
    tables.append({"component": component, "parameters": list(names), "rest": True})
    return tables


def quantile_function(profile: dict[str, Any], grid: np.ndarray) -> np.ndarray:
    """The service-time quantiles the simulator draws from (compass.domain.profiles)."""
    return np.asarray(parse_profile(profile, "profile").distribution.quantile(grid))


def main() -> int:
    """Generate the file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    spec, rows = load_rag_paper()
    space = Space.from_spec(spec)
    profiles = json.loads((args.data / "planner_latency_profiles.json").read_text())["profiles"]
    measured = {config_key(p["config"]): quantile_function(p, GRID) for p in profiles}

    # Log-additive latency model on the profiled configurations: one-hot main effects.
    def features(config: dict[str, object]) -> np.ndarray:
        row = space.rows[space.index(config)]
        return np.concatenate(
            [[1.0]]
            + [
                (np.arange(len(p.values)) == row[j]).astype(float)[1:]
                for j, p in enumerate(space.parameters)
            ]
        )

    X = np.array([features(p["config"]) for p in profiles])
    y = np.log([p["latency_mean_ms"] for p in profiles])
    coefficients, *_ = np.linalg.lstsq(X, y, rcond=None)
    shape = np.mean(
        [measured[config_key(p["config"])] / p["latency_mean_ms"] for p in profiles], axis=0
    )

    ledger = build_replay_ledger(rows, RAG_PAPER_SAMPLES, LEDGER_SEED)
    configs = {}
    for line in ledger:
        key = config_key(line["config"])
        if key in measured:
            quantiles, source = measured[key], "measured"
        else:
            quantiles, source = (
                shape * float(np.exp(features(line["config"]) @ coefficients)),
                "predicted",
            )
        configs[key] = {
            "latency_source": source,
            "latency_quantiles_ms": [round(float(q), 3) for q in quantiles],
            "scores": line["scores"],
        }
    document = {
        "about": "rag-sim data, written by hack/gen_rag_sim.py from the Compass paper's data",
        "samples": RAG_PAPER_SAMPLES,
        "quantile_grid": [round(float(u), 6) for u in GRID],
        "configs": configs,
        "stages": stage_tables(configs),
    }
    args.output.write_text(json.dumps(document, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.output}: {len(configs)} configurations, {len(measured)} measured")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

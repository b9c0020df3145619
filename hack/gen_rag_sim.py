"""Write rag-sim's data file from the paper's measurements (run when the data or the model change).

    python hack/gen_rag_sim.py [--data ../shared/data/compass-paper] [--output PATH]

Per configuration of the RAG grid (234): its per-question scores (the embedded replay ledger,
so searching rag-sim through Triton sees exactly what `compass demo` replays) and its latency
quantile function. The 79 configurations the paper profiled use their own measured
distribution; the others, which the paper never timed because they miss tau = 0.75, get one
predicted by a log-additive model fitted on the 79 (generator + retriever_k + reranker_k +
reranker_model), with the profiled configurations' average shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "operator"))

from compass.domain.space import Space, config_key  # noqa: E402
from compass.examples import RAG_PAPER_SAMPLES, build_replay_ledger, load_rag_paper  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "compass-paper"
DEFAULT_OUTPUT = REPO_ROOT / "model-images" / "rag-sim" / "models" / "rag_sim.json"
LEDGER_SEED = 0  # the demo's replay seed (compass.cli.DEMO_LEDGER_SEED)
GRID = np.linspace(0.0, 1.0, 101)


def quantile_function(profile: dict[str, float], grid: np.ndarray) -> np.ndarray:
    """Piecewise-linear quantile function through p50, p95 and p99 whose mean is the mean."""
    p50, p95, p99 = (profile[f"latency_p{q}_ms"] for q in (50, 95, 99))
    top = p99 + (p99 - p95) / 4
    # Solve the left end so the area under the quantile function equals the measured mean.
    rest = 0.45 * (p50 + p95) / 2 + 0.04 * (p95 + p99) / 2 + 0.01 * (p99 + top) / 2
    bottom = float(np.clip(4 * (profile["latency_mean_ms"] - rest) - p50, 0.5 * p50, p50))
    return np.interp(grid, [0.0, 0.5, 0.95, 0.99, 1.0], [bottom, p50, p95, p99, top])


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
        "quantile_grid": [round(float(u), 2) for u in GRID],
        "configs": configs,
    }
    args.output.write_text(json.dumps(document, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.output}: {len(configs)} configurations, {len(measured)} measured")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Concurrent search on the paper's two grids: wall time at K requests in flight, same answer.

Run as ``python bench/search_concurrency.py [--concurrency 1,4,16,64] [--batch 16]
[--service-s 1.0] [--seeds 1] [--jobs 2] [--only rag|vision]``. Each grid's rows are replayed
(as bench/search_paper.py does) behind a virtual clock: every sample request takes the mean
service time times a factor in [0.5, 1.5) fixed by (configuration, sample), served by K servers
first come first served (``compass.evaluators.concurrency.VirtualRunner``). The baseline is
the sequential search (batch 1, one request at a time): its evaluation time is the sum of its
service times. At each K the batched search must finish within 1.25x of that time / K, with at
most 10% more sample evaluations, the same feasible set as the sequential search and the same
everything (verdicts, sample counts) at every K. The script always exits 0; the floors are
printed as PASS/FAIL lines.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import search_paper as paper
from compass.domain.search import SearchOutcome, SearchSettings, search
from compass.evaluators.concurrency import VirtualRunner, jittered_service

# The batch the figures are measured at: enough configurations a round to keep K = 16 busy.
BATCH = 16

FLOOR_WALL = 1.25
FLOOR_SAMPLES = 1.10
TOLERANCE = 1e-9


@dataclass(frozen=True)
class Job:
    """One (grid, tau, seed) at every concurrency."""

    data_dir: str
    name: str
    tau: float
    seed: int
    batch: int
    service_s: float
    concurrencies: tuple[int, ...]


@dataclass(frozen=True)
class Result:
    """The sequential baseline and the batched search at each concurrency."""

    job: Job
    truth: frozenset[int]
    sequential_found: frozenset[int]
    sequential_samples: int
    sequential_time: float
    samples: int
    found: frozenset[int]
    same_at_every_k: bool
    wall: dict[int, float]


def run(job: Job) -> Result:
    """The sequential search, then the batched one at each concurrency."""
    space, _, accuracy = paper.load_grid(job.data_dir, job.name)
    truth = frozenset(i for i, a in enumerate(accuracy) if a >= job.tau - TOLERANCE)
    table = paper.replay_table(job.data_dir, job.name, 1000 + job.seed)
    population = paper.WORKFLOWS[job.name].population
    service = jittered_service(job.service_s)

    def one(batch: int, k: int) -> tuple[SearchOutcome, VirtualRunner]:
        evaluator = paper.ReplayEvaluator(table)
        runner = VirtualRunner(evaluator, k, service)
        settings = SearchSettings(tau=job.tau, seed=job.seed, batch=batch)
        return search(space, evaluator, population, settings, runner=runner), runner

    sequential, seq_runner = one(1, 1)
    answers = []
    wall: dict[int, float] = {}
    samples = 0
    found: frozenset[int] = frozenset()
    for k in job.concurrencies:
        outcome, runner = one(job.batch, k)
        answers.append(sorted((a.index, a.verdict.value, a.samples) for a in outcome.assessments))
        wall[k] = runner.clock
        samples = outcome.sample_evals
        found = frozenset(a.index for a in outcome.feasible)
    return Result(
        job=job,
        truth=truth,
        sequential_found=frozenset(a.index for a in sequential.feasible),
        sequential_samples=sequential.sample_evals,
        sequential_time=seq_runner.busy,
        samples=samples,
        found=found,
        same_at_every_k=all(a == answers[0] for a in answers),
        wall=wall,
    )


def main() -> int:
    """Print the table and the floors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help=f"configurations a round evaluates side by side (default {BATCH}; the search's own default, 1, overlaps only one configuration's samples)",
    )
    parser.add_argument("--service-s", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=sorted(paper.WORKFLOWS))
    parser.add_argument("--data", default=str(paper.DEFAULT_DATA))
    args = parser.parse_args()
    concurrencies = tuple(int(k) for k in args.concurrency.split(","))
    names = [args.only] if args.only else list(paper.WORKFLOWS)
    jobs = [
        Job(str(Path(args.data)), name, tau, seed, args.batch, args.service_s, concurrencies)
        for name in names
        for tau in paper.WORKFLOWS[name].taus
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run, jobs))

    print(
        f"batch {args.batch}, service {args.service_s:g} s a sample (x0.5-1.5, fixed per "
        f"sample), {args.seeds} seed(s); wall time as a multiple of the sequential search's "
        "evaluation time / K"
    )
    header = f"{'grid':<7}{'tau':>6}{'seq evals':>10}{'evals':>8}{'+%':>6}{'recall':>8}"
    header += "".join(f"{'K=' + str(k):>8}" for k in concurrencies) + "  same"
    print(header)
    failures: list[str] = []
    totals: dict[str, list[float]] = {}
    for r in results:
        recall = len(r.found & r.truth) / len(r.truth) if r.truth else 1.0
        extra = r.samples / r.sequential_samples - 1
        cells = ""
        for k in concurrencies:
            ratio = r.wall[k] / (r.sequential_time / k)
            cells += f"{ratio:>8.2f}"
        same = r.same_at_every_k and r.found == r.sequential_found
        print(
            f"{r.job.name:<7}{r.job.tau:>6g}{r.sequential_samples:>10,}{r.samples:>8,}"
            f"{100 * extra:>6.1f}{recall:>8.3f}{cells}  {'yes' if same else 'NO'}"
        )
        if not same:
            failures.append(f"{r.job.name} tau {r.job.tau:g} seed {r.job.seed}: answers differ")
        total = totals.setdefault(r.job.name, [0.0, 0.0])
        total[0] += r.sequential_samples
        total[1] += r.samples
    print()
    for name, total in totals.items():
        seq_time = sum(r.sequential_time for r in results if r.job.name == name)
        walls = {k: sum(r.wall[k] for r in results if r.job.name == name) for k in concurrencies}
        extra = total[1] / total[0] - 1
        line = (
            f"{name}: {extra:+.1%} sample evaluations over the sequential search; wall / (seq/K):"
        )
        for k in concurrencies:
            ratio = walls[k] / (seq_time / k)
            line += f" K={k} {ratio:.2f}"
            verdict = "PASS" if ratio <= FLOOR_WALL else "FAIL"
            print(
                f"{verdict} {name} K={k}: wall {walls[k]:,.0f} s vs {seq_time / k:,.0f} s "
                f"(sequential / K): {ratio:.2f}x (floor {FLOOR_WALL}x)"
            )
        print(line)
        verdict = "PASS" if total[1] <= FLOOR_SAMPLES * total[0] else "FAIL"
        print(
            f"{verdict} {name}: {total[1]:,.0f} sample evaluations vs {total[0]:,.0f} "
            f"sequential ({extra:+.1%}, floor +{FLOOR_SAMPLES - 1:.0%})"
        )
    print(
        f"{'FAIL' if failures else 'PASS'} same feasible set, verdicts and samples at every K "
        "and as the sequential search's feasible set"
    )
    for failure in failures:
        print(f"  {failure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

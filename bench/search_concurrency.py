"""Concurrent search on the paper's two grids: wall time at K requests in flight, same answer.

Run as ``python bench/search_concurrency.py [--concurrency 1,4,16,64] [--batch 8]
[--ahead N] [--service-s 1.0] [--seeds 1] [--jobs 2] [--only rag|vision]``. Each grid's rows
are replayed (as bench/search_paper.py does) behind a virtual clock: every sample request takes
the mean service time times a factor in [0.5, 1.5) fixed by (configuration, sample), served by
K servers first come first served (``compass.evaluators.concurrency.VirtualRunner``); servers
that no chunk needs score the samples the search expects next (``--ahead``: at most that many
a configuration; 0: none). The baseline is the sequential search (batch 1, one request at a
time): its evaluation time is the sum of its service times. At each K the batched search must
finish within 1.25x of that time / K, sending at most 10% more sample requests (those scored
ahead for nothing included), with the same feasible set as the sequential search and the same
everything (verdicts, sample counts) at every K. The script always exits 0; the floors are
printed as PASS/FAIL lines.

``--live`` searches through real tritonservers instead (``--replicas`` of rag-sim, each with a
router of ``--router-instances`` instances, latencies on at ``--time-scale``): the sequential
search (batch 1, one request at a time to one server, as ``compass demo`` searched) and the
concurrent one (``--batch``, ``--live-concurrency`` requests in flight over every server; default
replicas x router instances) on the same space (``--generators`` narrows the demo's to those
generator models) and ``--tau``: wall times, their ratio (floor 6x) and whether the feasible
sets are equal.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import search_paper as paper
from compass.domain.search import SearchOutcome, SearchSettings, search
from compass.domain.space import Space, config_key
from compass.evaluators.concurrency import ThreadRunner, VirtualRunner, jittered_service
from compass.evaluators.factory import ScoreSource, make_evaluator, make_runner
from compass.examples import load_rag_paper
from compass_dev.scenarios import QUESTIONS, rag_sim_fleet

# The batch the figures are measured at: with samples scored ahead filling what a round leaves
# idle, 8 keeps K = 64 within the floor at fewer evaluations than 16 (bench/README.md).
BATCH = 8

FLOOR_WALL = 1.25
FLOOR_LIVE_SPEEDUP = 6.0
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
    ahead: int | None


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
    sent: dict[int, int]


def run(job: Job) -> Result:
    """The sequential search, then the batched one at each concurrency."""
    space, _, accuracy = paper.load_grid(job.data_dir, job.name)
    truth = frozenset(i for i, a in enumerate(accuracy) if a >= job.tau - TOLERANCE)
    table = paper.replay_table(job.data_dir, job.name, 1000 + job.seed)
    population = paper.WORKFLOWS[job.name].population
    service = jittered_service(job.service_s)

    def one(batch: int, k: int, ahead: int | None) -> tuple[SearchOutcome, VirtualRunner]:
        evaluator = paper.ReplayEvaluator(table)
        runner = VirtualRunner(evaluator, k, service, ahead)
        settings = SearchSettings(tau=job.tau, seed=job.seed, batch=batch)
        return search(space, evaluator, population, settings, runner=runner), runner

    sequential, seq_runner = one(1, 1, 0)
    answers = []
    wall: dict[int, float] = {}
    sent: dict[int, int] = {}
    samples = 0
    found: frozenset[int] = frozenset()
    for k in job.concurrencies:
        outcome, runner = one(job.batch, k, job.ahead)
        answers.append(sorted((a.index, a.verdict.value, a.samples) for a in outcome.assessments))
        wall[k] = runner.clock
        sent[k] = runner.sent
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
        sent=sent,
    )


def live_space(generators: str | None) -> Space:
    """The demo's space (the paper's RAG grid), narrowed to these generator models if given."""
    spec = load_rag_paper()[0]
    if generators:
        wanted = [g.strip() for g in generators.split(",") if g.strip()]
        for parameter in spec["parameters"]:
            if parameter["name"] == "generator_model":
                unknown = sorted(set(wanted) - set(parameter["values"]))
                if unknown:
                    raise SystemExit(f"--generators: {unknown} not in {parameter['values']}")
                parameter["values"] = wanted
    return Space.from_spec(spec)


def timed_search(
    space: Space, addresses: list[str], settings: SearchSettings, concurrency: int
) -> tuple[SearchOutcome, float, ThreadRunner | None]:
    """One search through the routers at these addresses; its outcome, wall time and runner."""
    source = ScoreSource(triton=",".join(addresses))
    evaluator = make_evaluator(source)
    runner = make_runner(source, evaluator, concurrency)
    started = time.monotonic()
    try:
        outcome = search(space, evaluator, QUESTIONS, settings, runner=runner)
    finally:
        if isinstance(runner, ThreadRunner):
            runner.close()
    return outcome, time.monotonic() - started, runner if isinstance(runner, ThreadRunner) else None


def run_live(args: argparse.Namespace) -> int:
    """The sequential and the concurrent search through real rag-sim tritonservers."""
    space = live_space(args.generators)
    concurrency = args.live_concurrency or args.replicas * args.router_instances
    workdir = Path(tempfile.mkdtemp(prefix="compass-search-live-"))
    print(
        f"rag-sim on {args.replicas} tritonserver(s), router of {args.router_instances} "
        f"instances each, latencies x{args.time_scale:g}; {space.size} configurations, "
        f"{QUESTIONS} samples, tau {args.tau:g}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with rag_sim_fleet(workdir, args.time_scale, args.replicas, args.router_instances) as servers:
        addresses = [s.grpc_url for s in servers]
        runs = {}
        for name in args.runs.split(","):
            if name == "sequential":
                settings = SearchSettings(tau=args.tau, seed=0, batch=1)
                runs[name] = timed_search(space, addresses[:1], settings, 1)
            else:
                settings = SearchSettings(tau=args.tau, seed=0, batch=args.batch)
                runs[name] = timed_search(space, addresses, settings, concurrency)
            outcome, wall, runner = runs[name]
            extra = (
                f", {runner.sent:,} requests sent ({runner.wasted:,} ahead for nothing)"
                if runner
                else ""
            )
            print(
                f"{name}: wall {wall:,.1f} s, {outcome.sample_evals:,} sample evaluations"
                f"{extra}, {len(outcome.feasible)} feasible; load average "
                f"{os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if len(runs) < 2:
        return 0
    (seq, seq_wall, _), (conc, conc_wall, _) = runs["sequential"], runs["concurrent"]
    same = {config_key(space.config(a.index)) for a in seq.feasible} == {
        config_key(space.config(a.index)) for a in conc.feasible
    }
    speedup = seq_wall / conc_wall
    print(
        f"{'PASS' if speedup >= FLOOR_LIVE_SPEEDUP else 'FAIL'} live: concurrent ({concurrency} "
        f"in flight, batch {args.batch}) {speedup:.2f}x faster than sequential "
        f"(floor {FLOOR_LIVE_SPEEDUP:g}x)"
    )
    print(f"{'PASS' if same else 'FAIL'} live: the same feasible set ({len(seq.feasible)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Print the table and the floors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help=f"configurations a round evaluates side by side (default {BATCH}; the search's own default, 1, overlaps only one configuration's samples)",
    )
    parser.add_argument(
        "--ahead",
        type=int,
        default=None,
        help="samples a configuration may have scored ahead on idle servers (default: all the "
        "search expects; 0: none, the rounds alone)",
    )
    parser.add_argument("--service-s", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=sorted(paper.WORKFLOWS))
    parser.add_argument("--data", default=str(paper.DEFAULT_DATA))
    live = parser.add_argument_group("live (--live): real rag-sim tritonservers")
    live.add_argument("--live", action="store_true")
    live.add_argument("--replicas", type=int, default=2)
    live.add_argument("--router-instances", type=int, default=4)
    live.add_argument("--time-scale", type=float, default=0.2)
    live.add_argument("--tau", type=float, default=0.75, help="the demo's default")
    live.add_argument("--generators", help="narrow the space to these generator models")
    live.add_argument(
        "--live-concurrency", type=int, default=None, help="default replicas x router instances"
    )
    live.add_argument(
        "--runs",
        default="sequential,concurrent",
        help="which searches, in this order (comma-separated; one alone prints its time only)",
    )
    parser.add_argument("--taus", help="only these thresholds (comma-separated)")
    args = parser.parse_args(argv)
    if args.live:
        if not set(args.runs.split(",")) <= {"sequential", "concurrent"}:
            parser.error(f"--runs: give sequential and/or concurrent, got {args.runs}")
        return run_live(args)
    concurrencies = tuple(int(k) for k in args.concurrency.split(","))
    names = [args.only] if args.only else list(paper.WORKFLOWS)
    jobs = [
        Job(
            str(Path(args.data)),
            name,
            tau,
            seed,
            args.batch,
            args.service_s,
            concurrencies,
            args.ahead,
        )
        for name in names
        for tau in paper.WORKFLOWS[name].taus
        if args.taus is None or tau in {float(t) for t in args.taus.split(",")}
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run, jobs))

    ahead = "all expected" if args.ahead is None else str(args.ahead)
    print(
        f"batch {args.batch}, scored ahead: {ahead}, service {args.service_s:g} s a sample "
        f"(x0.5-1.5, fixed per sample), {args.seeds} seed(s); per K: wall time as a multiple of "
        "the sequential search's evaluation time / K, and sample requests sent (+% over the "
        "sequential search's evaluations, those scored ahead for nothing included)"
    )
    header = f"{'grid':<7}{'tau':>6}{'seq evals':>10}{'evals':>8}{'+%':>6}{'recall':>8}"
    header += "".join(f"{'K=' + str(k):>14}" for k in concurrencies) + "  same"
    print(header)
    failures: list[str] = []
    for r in results:
        recall = len(r.found & r.truth) / len(r.truth) if r.truth else 1.0
        extra = r.samples / r.sequential_samples - 1
        cells = ""
        for k in concurrencies:
            ratio = r.wall[k] / (r.sequential_time / k)
            cells += f"{ratio:>7.2f}{100 * (r.sent[k] / r.sequential_samples - 1):>+6.1f}%"
        same = r.same_at_every_k and r.found == r.sequential_found
        print(
            f"{r.job.name:<7}{r.job.tau:>6g}{r.sequential_samples:>10,}{r.samples:>8,}"
            f"{100 * extra:>6.1f}{recall:>8.3f}{cells}  {'yes' if same else 'NO'}"
        )
        if not same:
            failures.append(f"{r.job.name} tau {r.job.tau:g} seed {r.job.seed}: answers differ")
    print()
    for name in dict.fromkeys(r.job.name for r in results):
        mine = [r for r in results if r.job.name == name]
        seq_time = sum(r.sequential_time for r in mine)
        seq_samples = sum(r.sequential_samples for r in mine)
        recorded = sum(r.samples for r in mine)
        line = (
            f"{name}: {recorded / seq_samples - 1:+.1%} sample evaluations recorded over the "
            "sequential search; wall / (seq/K), requests sent:"
        )
        for k in concurrencies:
            wall = sum(r.wall[k] for r in mine)
            sent = sum(r.sent[k] for r in mine)
            ratio = wall / (seq_time / k)
            line += f" K={k} {ratio:.2f} {sent / seq_samples - 1:+.1%};"
            verdict = "PASS" if ratio <= FLOOR_WALL else "FAIL"
            print(
                f"{verdict} {name} K={k}: wall {wall:,.0f} s vs {seq_time / k:,.0f} s "
                f"(sequential / K): {ratio:.2f}x (floor {FLOOR_WALL}x)"
            )
            verdict = "PASS" if sent <= FLOOR_SAMPLES * seq_samples else "FAIL"
            print(
                f"{verdict} {name} K={k}: {sent:,} sample requests vs {seq_samples:,} sequential "
                f"({sent / seq_samples - 1:+.1%}, floor +{FLOOR_SAMPLES - 1:.0%})"
            )
        print(line.rstrip(";"))
    print(
        f"{'FAIL' if failures else 'PASS'} same feasible set, verdicts and samples at every K "
        "and as the sequential search's feasible set"
    )
    for failure in failures:
        print(f"  {failure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

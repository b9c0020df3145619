"""The router's late-binding decision per stage: how long binding one stage takes in
model-images/router/model.py, on rag-sim's plan from the paper's profiles.

Run as ``python bench/router_binding.py [--requests 20000] [--configs 79] [--busy 4]
[--waiting 0] [--lag 0.3 --lag-reserve 2]``. Each request gets a lazy config (``LazyConfig``) with a deadline drawn in
[0, 1.5 s] and reads one parameter of each stage in order, as a staged pipeline would; ``--busy``
other router instances hold requests at random stages in the shared in-flight table;
``--waiting`` more wait at the router's gate (``compass_pipeline_slots``) behind it, each with
a deadline drawn as its own, which each stage's binding reads and spares; ``--lag`` caps each
stage's extra time by the lag behind static fastest's schedule (the table's lag_share, with a
1500 ms SLO), the first stage drawing the request's start there under the table's lock. Printed: p50, p99 and
max of each stage's binding (the decision, the in-flight table's read and the binding; the
first stage also counts the request in the pod's rate and makes its lazy config), in
microseconds, on the wall clock and this thread's CPU clock, and the issue's floor (p99 <= 1
ms). The script always exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from compass.domain.binding import (
    RAG_SIM_COMPONENTS,
    RAG_SIM_SHARES,
    RAG_SIM_STAGE_PARAMS,
    router_table,
    stage_plan,
)
from compass.domain.profiles import parse_profiles
from compass_dev.router_module import router_part
from compass_rules.binding import check_binding

PROFILES = Path(__file__).resolve().parent / "data/compass-paper/planner_latency_profiles.json"
FLOOR_MS = 1.0


# The deadlines drawn for the requests (and the waiters at the gate) without a table's SLO, s.
DEADLINES_S = 1.5
# Timing under a live run's load (time_bindings_until): a few requests a quarter second, so
# that the timing itself takes ~2% of a core from the run it measures.
LOADED_BATCH = 5
LOADED_EVERY_S = 0.25


def time_bindings(
    table: dict[str, Any], requests: int, busy: int, waiting: int, deadlines_s: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Each request's binding of each rag-sim stage on the router's own code and ``table``
    (as sent), us on the wall clock and on this thread's CPU clock: its deadline drawn in [0,
    ``deadlines_s``], ``busy`` other requests in flight at random stages, ``waiting`` more at
    the gate behind it (each with a deadline drawn the same way); the first stage also counts
    the request in the pod's rate, draws its static fastest start under the lag cap and makes
    its lazy config. A stage after a refusal (LateError) costs 0."""
    gate, binding, state = (router_part(m) for m in ("gate", "binding", "state"))
    checked = check_binding(json.loads(json.dumps(table)))
    fastest_ns = checked["arrays"]["fastest_ms"][1] * 1e6
    capped = checked["lag_share"] is not None
    rng = np.random.default_rng(0)
    stages = len(RAG_SIM_STAGE_PARAMS)
    took = np.zeros((requests, stages))
    # The same on this thread's CPU clock: what the decision costs, without the time the
    # machine's other work took the core away (wall p99 on a loaded machine is its scheduler's).
    cpu = np.zeros((requests, stages))
    with tempfile.TemporaryDirectory() as directory:
        inflight = gate.Inflight(os.path.join(directory, "inflight.bin"))
        # Other instances (this process's parent stands in for them: it is alive).
        for k in range(busy):
            slot = (inflight.slot + 1 + k) % gate.INFLIGHT_SLOTS
            gate._SLOT.pack_into(
                inflight.table,
                slot * gate._SLOT.size,
                os.getppid(),
                int(rng.integers(0, stages)),
                time.monotonic_ns(),
                float(rng.uniform(5, 300)),
            )
        gated = waiting > 0
        if gated:
            inflight.queue_at_gate(None)
            inflight.pass_gate(1)
        for request in range(requests):
            deadline = time.time_ns() + int(rng.uniform(0, deadlines_s * 1e9))
            for k in range(waiting):
                # Behind it at the gate, in arrival order, each with its own deadline.
                slot = (inflight.slot + 1 + busy + k) % gate.INFLIGHT_SLOTS
                inflight.gate_slots[slot] = (
                    os.getppid(),
                    int(inflight.gate_slots[inflight.slot, 1]) + 1 + k,
                    gate.GATE_WAITING,
                    time.time_ns() + int(rng.uniform(0, deadlines_s * 1e9)),
                    time.time_ns(),
                )
            for stage, names in enumerate(RAG_SIM_STAGE_PARAMS):
                begin, begin_cpu = time.perf_counter_ns(), time.thread_time_ns()
                try:
                    if stage == 0:
                        # What the router does as it takes a request up: count it, (with the
                        # lag cap) draw its static fastest start, make its config.
                        qps = inflight.dispatched()
                        start = None
                        if capped:
                            start = inflight.static_start(time.time_ns(), fastest_ns, 1)
                        config = binding.LazyConfig(
                            checked, deadline, inflight, qps, gated=gated, static_start_ns=start
                        )
                    config[names[0]]
                    refused = False
                except state.LateError:
                    refused = True
                took[request, stage] = (time.perf_counter_ns() - begin) / 1000
                cpu[request, stage] = (time.thread_time_ns() - begin_cpu) / 1000
                if refused:
                    break
    return took, cpu


def time_bindings_until(
    table: dict[str, Any],
    waiting: int,
    go: Event,
    stop: Event,
    sink: Connection,
    every_s: float = LOADED_EVERY_S,
) -> None:
    """A child process's loop while a live run serves: from ``go`` until ``stop``,
    ``LOADED_BATCH`` requests' bindings (``time_bindings``, ``waiting`` at the gate) every
    ``every_s``; then each request's wall time over its stages, s, to ``sink``. The decision as
    the pods' CPU contention stretches it, which an idle machine's timing does not show
    (1.3-1.6x on 2 cores under a trace window at x0.2)."""
    times: list[float] = []
    go.wait()
    while not stop.is_set():
        took, _ = time_bindings(table, LOADED_BATCH, 0, waiting, table["slo_ms"] / 1000)
        times += (took.sum(axis=1) / 1e6).tolist()
        stop.wait(every_s)
    sink.send(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests to bind")
    parser.add_argument(
        "--configs", type=int, default=79, help="allowed configurations (the paper has 79)"
    )
    parser.add_argument("--busy", type=int, default=4, help="other instances' requests in flight")
    parser.add_argument(
        "--waiting", type=int, default=0, help="requests waiting at the gate behind it"
    )
    parser.add_argument(
        "--lag", type=float, default=None, help="the table's lag_share (None: no lag cap)"
    )
    parser.add_argument("--lag-reserve", type=int, default=2, help="with --lag: lag_reserve")
    args = parser.parse_args(argv)
    if (
        args.requests < 1
        or not 1 <= args.configs <= 79
        or not 0 <= args.busy < 63
        or not 0 <= args.waiting < 63 - args.busy
    ):
        parser.error(
            "--requests >= 1, --configs in 1..79, --busy in 0..62, --busy + --waiting < 63"
        )
    profiles = parse_profiles(json.loads(PROFILES.read_text(encoding="utf-8")))[: args.configs]
    plan = stage_plan(profiles, quantile=0.95, prior_shares=RAG_SIM_SHARES)
    capped = {"slo_ms": 1500.0, "lag_share": args.lag, "lag_reserve": args.lag_reserve}
    sent = router_table(plan, RAG_SIM_COMPONENTS, **(capped if args.lag is not None else {}))
    stages = len(RAG_SIM_STAGE_PARAMS)
    took, cpu = time_bindings(sent, args.requests, args.busy, args.waiting, DEADLINES_S)
    print(
        f"router late binding: {len(plan.configs)} allowed configurations, {stages} stages, "
        f"{args.busy} other requests in flight, {args.waiting} waiting at the gate, "
        f"lag cap {'none' if args.lag is None else f'{args.lag:g} (reserve {args.lag_reserve})'}, "
        f"{args.requests} requests; per stage, us:"
    )
    for stage, names in enumerate(RAG_SIM_STAGE_PARAMS):
        print(f"  stage {stage} ({', '.join(names)}):")
        for clock, values in (("wall", took), ("cpu", cpu)):
            column = values[:, stage]
            print(
                f"    {clock:<4} p50 {np.percentile(column, 50):7.1f}  "
                f"p99 {np.percentile(column, 99):8.1f}  max {column.max():9.1f}"
            )
    for clock, values in (("wall", took), ("cpu", cpu)):
        worst = float(np.percentile(values, 99, axis=0).max()) / 1000
        verdict = "PASS" if worst <= FLOOR_MS else "FAIL"
        print(
            f"{verdict} decision per stage p99 <= {FLOOR_MS:g} ms ({clock} clock): worst stage "
            f"{worst:.3f} ms (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What Triton's queue policy allows the router: late-last order, and what it costs.

    python bench/triton_queue.py [--time-scale 0.1] [--burst 20] [--late-after 3]

PARD orders its queue so that a request that can no longer meet its SLO waits behind the ones
that can. Triton has that order built in: the dynamic batcher's queue policy ``timeout_action:
DELAY`` moves a request whose timeout (Triton's per-request ``timeout``, us) passed while it
queued behind every request still in time, and the router can enable the dynamic batcher
without batching (``max_batch_size: 0``). This bench serves one burst on rag-sim's router,
every request on the most accurate configuration, three ways: the router as shipped (FIFO),
with the DELAY policy and no per-request timeouts (its default timeout, an hour, is one too),
and with it and each request's timeout set to ``--late-after`` services. It prints how long the burst took to drain against its work
(burst x one service), how many requests finished within ``--late-after`` + 1 services, and
the order in which they finished.

Measured on nvidia-pytriton's Triton (2.51): any queue timeout turns off the dynamic batcher's
payload prefetch, and then an instance that finishes is not taken up again until a new
request arrives or 500 ms pass (the batcher is woken when the payload completes, before the
instance waits for the next one): a backlog drains with a stall after some services. The
order itself works (probed: a request past its timeout served after a later one still in
time), but the stalls cost more than it wins, so the router ships FIFO and the simulator
measures what the order would be worth (bench/serving_sim.py --late-last).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from compass.dataplane.load import RequestRecord, run_load
from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, assemble_repository
from compass_dev.scenarios import ACCURATE, COMPONENTS
from compass_rules.protocol import OVERRIDE_PARAMETER

# Triton's queue policy: DELAY, a default timeout (so that a request may lower it) of an hour.
DELAY_POLICY = """dynamic_batching {
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 3600000000
    allow_timeout_override: true
  }
}
"""
# Every request takes the same service time (the configuration's median), so the order in
# which requests finish is the order in which the router took them up.
PAYLOAD = {"quantile": 0.5}


def with_delay_policy(config: str) -> str:
    """A router config with the DELAY queue policy before its instance group."""
    if "dynamic_batching" in config:
        raise ValueError("the router config already has a dynamic_batching block")
    return re.sub(r"(?m)^instance_group", DELAY_POLICY + "instance_group", config, count=1)


def serve_burst(
    workdir: Path, time_scale: float, burst: int, late_after: float | None, delay_policy: bool
) -> tuple[float, list[RequestRecord]]:
    """One tritonserver; the router's median service (s) and the burst's records."""
    repository = assemble_repository(
        "rag-sim",
        workdir / "models",
        {component: {"time_scale": str(time_scale)} for component in COMPONENTS},
    )
    if delay_policy:
        config = repository / "router" / "config.pbtxt"
        config.write_text(with_delay_policy(config.read_text(encoding="utf-8")), encoding="utf-8")
    with LocalTriton(repository=repository).start(workdir) as server:
        router = TritonRouter(server.grpc_url)
        try:
            service_s = statistics.median(
                router.infer({"sample": i, **PAYLOAD}, config=ACCURATE).latency_s for i in range(7)
            )
        finally:
            router.close()
        # A tenth of a service apart: requests sent at once reach Triton's queue in any order.
        records = run_load(
            server.grpc_url,
            [0.1 * i * service_s for i in range(burst)],
            lambda i: {"sample": i, **PAYLOAD},
            parameters={OVERRIDE_PARAMETER: config_key(ACCURATE)},
            queue_timeout_s=None if late_after is None else late_after * service_s,
        )
    return service_s, records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=0.1, help="rag-sim's time scale")
    parser.add_argument("--burst", type=int, default=20, help="requests in the burst")
    parser.add_argument(
        "--late-after", type=float, default=3.0, help="each request's timeout, in services"
    )
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    if not args.time_scale > 0 or args.burst < 2 or not args.late_after > 0:
        parser.error("--time-scale and --late-after must be > 0, --burst >= 2")
    print(
        f"rag-sim's router on Triton (CPU), time scale {args.time_scale:g}: a burst of "
        f"{args.burst} requests a tenth of a service apart, each on the most accurate "
        "configuration"
    )
    print(f"{'queue':<28} {'service ms':>10} {'drain s':>8} {'x work':>7} {'in time':>8}  order")
    rows = []
    for name, late_after, delay_policy in (
        ("FIFO (as shipped)", None, False),
        ("DELAY, no request timeout", None, True),
        (f"DELAY, timeout {args.late_after:g} services", args.late_after, True),
    ):
        with tempfile.TemporaryDirectory(prefix="compass-queue-") as tmp:
            service_s, records = serve_burst(
                Path(tmp), args.time_scale, args.burst, late_after, delay_policy
            )
        failed = [r.error for r in records if r.error]
        finish = [r.sent_s + r.latency_s for r in records]
        drain_s = max(finish)
        in_time = sum(r.latency_s <= (args.late_after + 1) * service_s for r in records)
        order = sorted(range(len(records)), key=lambda i: finish[i])
        rows.append(
            {
                "queue": name,
                "service_ms": service_s * 1000,
                "drain_s": drain_s,
                "work_ratio": drain_s / (args.burst * service_s),
                "in_time": in_time,
                "failed": len(failed),
                "order": order,
            }
        )
        print(
            f"{name:<28} {service_s * 1000:>10.1f} {drain_s:>8.2f} "
            f"{drain_s / (args.burst * service_s):>7.2f} {in_time:>5}/{len(records):<3} "
            f"{' '.join(map(str, order))}" + (f"  ({len(failed)} failed)" if failed else "")
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

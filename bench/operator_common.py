"""What bench/operator_scale.py and bench/operator_latency.py share: the real control plane,
rag-sim on Triton, `compass operator` as a child process, and reading its CPU, RSS and metrics.

Not a benchmark itself. Every process started here is registered on an ExitStack, so it is
stopped by PID on exit, on an error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from compass.api.meta import GROUP as GROUP
from compass.api.meta import POLICY_PLURAL as POLICY_PLURAL
from compass.api.meta import VERSION as VERSION
from compass.api.meta import WORKFLOW_PLURAL as WORKFLOW_PLURAL
from compass_dev.devcluster import Cluster, ensure_binaries
from compass_dev.local_triton import LocalTriton
from compass_dev.processes import wait_for
from compass_dev.scenarios import ACCURATE as ACCURATE
from compass_dev.scenarios import FASTEST as FASTEST
from compass_dev.scenarios import TEST_TIME_SCALE, rag_sim_triton

REPO_ROOT = Path(__file__).resolve().parents[1]

OUT_DIR = REPO_ROOT / "bench" / "out"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def interrupt_on_sigterm() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so the ExitStack's clean-up runs (SIGINT
    too when started in the background by a shell, which would leave it ignored)."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)


def start_cluster(stack: contextlib.ExitStack, workdir: Path) -> Cluster:
    """etcd + kube-apiserver + kube-controller-manager (hack/k8s/build.sh's cached binaries),
    with the compass.io CRDs applied and established."""
    binaries = ensure_binaries(stream=sys.stderr)
    cluster = Cluster(binaries, workdir / "k8s")
    stack.callback(cluster.stop)
    cluster.start()
    # Client-side validation off: kubectl 1.20 rejects schema keywords newer than itself
    # (x-kubernetes-validations), which the 1.20 API server simply drops.
    cluster.kubectl("apply", "--validate=false", "-f", str(REPO_ROOT / "crds"))
    for plural in (POLICY_PLURAL, WORKFLOW_PLURAL):
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.{GROUP}"
        )
    return cluster


def start_triton(
    stack: contextlib.ExitStack, workdir: Path, active: Mapping[str, Any] | None = None
) -> LocalTriton:
    """tritonserver serving rag-sim (router + three components) at the test tiers' time scale
    (compass_dev.scenarios.TEST_TIME_SCALE: FASTEST ~20 ms a request, ACCURATE ~33 ms)."""
    server = rag_sim_triton(workdir, TEST_TIME_SCALE, active)
    stack.callback(server.stop)
    return server.start(workdir)


def create_namespace(cluster: Cluster, name: str) -> str:
    """A namespace whose default service account has its token (pods can be admitted)."""
    cluster.request("/api/v1/namespaces", "POST", {"metadata": {"name": name}})

    def has_token() -> bool:
        try:
            account = cluster.request(f"/api/v1/namespaces/{name}/serviceaccounts/default")
        except OSError:
            return False
        return bool(account.get("secrets"))

    wait_for(has_token, 30, f"the default service account of {name}")
    return name


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the ")" that ends the command name, utime and stime are fields 12 and 13.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (/proc/PID/statm)."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * PAGE_BYTES / 2**20


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram's cumulative buckets (upper bound -> count), sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier``."""
        before = dict(earlier.buckets)
        return Histogram(
            tuple((bound, n - before.get(bound, 0.0)) for bound, n in self.buckets),
            self.total - earlier.total,
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        """histogram_quantile(): linear interpolation inside the bucket (None when empty)."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                share = (rank - below) / inside if inside > 0 else 1.0
                return lower + (bound - lower) * share
            lower, below = bound, cumulative
        return lower

    def mean(self) -> float | None:
        """Mean observation (None when empty)."""
        return self.total / self.count if self.count > 0 else None


def histogram(metrics_text: str, name: str) -> Histogram:
    """One unlabelled histogram from a /metrics page."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        buckets: list[tuple[float, float]] = []
        total = count = 0.0
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name.endswith("_sum"):
                total = float(sample.value)
            elif sample.name.endswith("_count"):
                count = float(sample.value)
        return Histogram(tuple(sorted(buckets)), total, count)
    return Histogram((), 0.0, 0.0)


def counter_total(metrics_text: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            named = sample.name in (name, f"{name}_total")
            if named and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def write_json(name: str, data: Mapping[str, Any]) -> Path:
    """Write raw results to bench/out/<name> and return the path."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / name
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def fmt(value: float | None, spec: str = ".1f") -> str:
    """A number for a table, '-' when unknown."""
    return "-" if value is None else format(value, spec)


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    """Print how long a set-up step took (to stderr, with the progress lines)."""
    started = time.monotonic()
    yield
    print(f"  {label}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def run_benchmark(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, contextlib.ExitStack], dict[str, Any]],
    report: Callable[[dict[str, Any]], None],
) -> int:
    """Run a benchmark whose servers live in one ExitStack, so Ctrl-C or SIGTERM stops them all;
    then keep its raw results in bench/out/ and print its tables."""
    interrupt_on_sigterm()
    with contextlib.ExitStack() as stack:
        try:
            data = run(args, stack)
        except KeyboardInterrupt:
            print("interrupted: stopping everything", file=sys.stderr)
            return 130
    path = write_json(args.out, {"args": vars(args), **data})
    report(data)
    print(f"raw results: {path}")
    return 0


def rag_sim_policy(
    name: str, metrics_url: str, grpc_url: str, downscale_cooldown_s: float
) -> dict[str, Any]:
    """A ParetoPolicy on the rag-sim router (time scale 0.1), deciding every second: its fastest
    and most accurate configurations as measured through the router, SLO 150 ms, switching to
    the fastest at once and back after the cooldown."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ParetoPolicy",
        "metadata": {"name": name},
        "spec": {
            "front": [
                {
                    "config": FASTEST,
                    "accuracy": 0.8318,
                    "latencyMeanMs": 20.5,
                    "latencyP95Ms": 23.0,
                },
                {
                    "config": ACCURATE,
                    "accuracy": 0.8604,
                    "latencyMeanMs": 33.5,
                    "latencyP95Ms": 37.5,
                },
            ],
            "slo": {"latencyMs": 150, "percentile": 95},
            "hysteresis": {
                "upscaleCooldownSeconds": 0,
                "downscaleCooldownSeconds": downscale_cooldown_s,
                "cooldownExponent": 0,
                "slackBufferMs": 20,
            },
            "metrics": {"type": "triton", "url": metrics_url},
            "routing": {"grpcEndpoint": grpc_url, "routerModel": "router"},
            "intervalSeconds": 1,
        },
    }

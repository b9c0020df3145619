"""How the operator scales with the number of ParetoPolicies: 1, 10, 100 (and 1,000, 3,000).

    python bench/operator_scale.py [--counts 1,10,100] [--window 30] [--no-switch-phase]
                                   [--strategy elastico|split|predictive]
                                   [--huge-workflows 2] [--churn 100] [--restart]
                                   [--py-spy SECONDS]

Everything is real: etcd, kube-apiserver and kube-controller-manager (compass_dev.devcluster,
binaries from hack/k8s/build.sh), one tritonserver serving rag-sim, and one `compass operator`
process watching one namespace. Each policy names a Service of its own (one policy acts on each
routing target), and the operator's address override (COMPASS_TRITON_ADDRESS_OVERRIDE) sends
them all to the one Triton; they read the same metrics URL. The router already serves the most
accurate configuration and nothing loads it, so each policy holds there: every tick is the
steady-state one (read the queue, decide, ask the router what it serves, write the status when
due). For each count, over --window seconds, it reports the operator's CPU (% of one core,
/proc/PID/stat) and RSS, the achieved decision period per policy, the decision latency (the
operator's compass_decision_seconds histogram) and the API server's writes a second (its own
apiserver_request_total).

The decision times come from the policies' own status: status.policyState.arrivals keeps one
(time, arrivals) sample per decision for the longest hysteresis window (the downscale cooldown,
120 s here: longer than the status heartbeat, which grows with the policy count), and the
statuses are read every few seconds (one list call): nothing is added to the operator.

The churn phase (--churn N, at the largest count) creates N policies and deletes N of the first
while the others tick, then checks that nothing of the deleted is left: objects, series in the
operator's /metrics, policies on its scheduler (compass_policies_scheduled). The restart phase
(--restart) SIGKILLs the operator and starts a new one: the seconds until every policy has acted
again (its gauges set by the new process), then a steady window of the new process.

The switch phase (at the largest count) flips the router to the fastest configuration every
--flip-every seconds from outside; each policy adopts it, and after a 2 s cooldown of empty
queue the policies climb back: real reloads made by the operator while all timers run.

The huge phase (at the largest count, --huge-workflows > 0) adds CompoundWorkflows in the
same namespace, each with the largest space the operator takes (MAX_SPACE_SIZE combinations,
every list at its schema bound where the product allows), and one beyond it (refused with
condition InvalidSpec): the policies' periods in that window, beside the steady one, show
whether one huge resource stretches the other resources' 1 s period.

--py-spy SECONDS records the operator's stacks (py-spy's collapsed "raw" format, idle threads
included, for flamegraph.pl or speedscope) during the largest count's windows. Raw results go
to bench/out/operator_scale.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from compass.api.meta import WORKFLOW_PLURAL
from compass.api.paretopolicy import ParetoPolicySpec
from compass.commands.common import add_enum_argument
from compass.dataplane.triton import TritonRouter
from compass.domain.space import (
    MAX_CONSTRAINT_LENGTH,
    MAX_CONSTRAINTS,
    MAX_SPACE_SIZE,
    config_key,
    explain_validation_error,
)
from compass.domain.strategy import Strategy
from compass_dev.devcluster import Cluster, Operator
from compass_dev.processes import wait_for
from operator_common import (
    ACCURATE,
    FASTEST,
    GROUP,
    OUT_DIR,
    POLICY_PLURAL,
    VERSION,
    counter_total,
    cpu_seconds,
    create_namespace,
    fmt,
    histogram,
    percentile,
    rag_sim_policy,
    rss_mib,
    run_benchmark,
    start_cluster,
    start_triton,
    timed,
)

STEADY_COOLDOWN_S = 120.0  # also how long each status keeps its decision times (> 1.5 heartbeats)
SWITCH_COOLDOWN_S = 2.0
STATUS_POLL_S = 4.0
# A policy whose median period is this long has fallen behind its 1 s interval (kopf's timer
# sleeps 1 s after each tick, so a healthy one runs at 1 s plus the tick's own time).
BEHIND_S = 1.25
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
# After the churn, how long the deleted policies' last ticks may take to end.
SERIES_GONE_S = 5.0


def policy_body(name: str, metrics_url: str, grpc_url: str, strategy: str) -> dict[str, Any]:
    """The benchmark's ParetoPolicy on the shared rag-sim router, with its strategy."""
    body = rag_sim_policy(name, metrics_url, grpc_url, STEADY_COOLDOWN_S)
    # A Service of its own: one policy acts on each routing target (the younger ones on a shared
    # target are TargetClaimed), so each policy names its own; the operator's address override
    # (COMPASS_TRITON_ADDRESS_OVERRIDE) reaches the one Triton behind all of them.
    body["spec"]["routing"] = {"service": f"triton-{name}", "routerModel": "router"}
    body["spec"]["strategy"] = strategy
    return body


def huge_workflow_body(name: str, metrics_url: str, combinations: int) -> dict[str, Any]:
    """A CompoundWorkflow whose space has ``combinations`` configurations (a power of ten times
    one leading factor) and as many constraints as the schema takes, none of them binding."""
    digits = len(str(combinations)) - 1
    lead = combinations // 10**digits
    parameters = [{"name": "lead", "type": "integer", "values": list(range(lead))}]
    parameters += [
        {"name": f"p{i}", "type": "integer", "values": list(range(10))} for i in range(digits)
    ]
    # Long, true for every configuration: their cost is paid on every row.
    padding = " " * (MAX_CONSTRAINT_LENGTH - len("p0 <= 9") - 1)
    constraints = [
        f"p{i % digits} <= 9{padding}"[:MAX_CONSTRAINT_LENGTH] for i in range(MAX_CONSTRAINTS)
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": name},
        "spec": {
            "space": {"parameters": parameters, "constraints": constraints},
            "evaluation": {
                "dataset": {"size": 100},
                "tau": 0.8,
                "evaluator": {"type": "command", "command": ["true"]},
            },
            "slo": {"latencyMs": 1000},
            "triton": {"service": "rag-sim-triton"},
            "serving": {"metrics": {"url": metrics_url}},
        },
    }


def create_huge_workflows(cluster: Cluster, namespace: str, count: int) -> list[str]:
    """``count`` workflows at the space limit and one beyond it; their names."""
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    url = f"http://prometheus.{namespace}.svc:9090"
    sizes = [MAX_SPACE_SIZE] * count + [MAX_SPACE_SIZE * 10]
    names = []
    for index, size in enumerate(sizes):
        body = huge_workflow_body(f"huge-{index}", url, size)
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, WORKFLOW_PLURAL, body, _preload_content=False
        )
        names.append(body["metadata"]["name"])
    return names


def workflow_conditions(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Each workflow's phase and its conditions' reasons, one line each."""
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    response: Any = api.list_namespaced_custom_object(
        GROUP, VERSION, namespace, WORKFLOW_PLURAL, _preload_content=False
    )
    found = {}
    for item in json.loads(response.data)["items"]:
        status = item.get("status") or {}
        reasons = ",".join(c.get("reason", "") for c in status.get("conditions") or [])
        found[item["metadata"]["name"]] = f"{status.get('phase')} [{reasons}]"
    return found


class Policies:
    """The benchmark's ParetoPolicies in one namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(cluster.api_client())
        self.namespace = namespace
        self.names: list[str] = []

    def create(self, body: dict[str, Any]) -> None:
        self.api.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, POLICY_PLURAL, body, _preload_content=False
        )
        self.names.append(body["metadata"]["name"])

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, POLICY_PLURAL, name, {"spec": spec},
            _content_type="application/merge-patch+json", _preload_content=False,
        )  # fmt: skip

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Every policy's status by name (one list call)."""
        response: Any = self.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, POLICY_PLURAL, _preload_content=False
        )
        items = json.loads(response.data)["items"]
        return {i["metadata"]["name"]: dict(i.get("status") or {}) for i in items}

    def all_ready(self, count: int) -> bool:
        """Whether ``count`` policies have decided and say Ready=True."""
        ready = 0
        for status in self.statuses().values():
            conditions = {c["type"]: c for c in status.get("conditions") or []}
            if conditions.get("Ready", {}).get("status") == "True" and status.get("policyState"):
                ready += 1
        return ready >= count


class DecisionTimes:
    """Decision times per policy, collected from status.policyState.arrivals while polling."""

    def __init__(self, policies: Policies) -> None:
        self.policies = policies
        self.times: dict[str, set[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.polls = 0

    def __enter__(self) -> DecisionTimes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.collect()  # the statuses written in the window's last seconds

    def _poll(self) -> None:
        while not self._stop.wait(STATUS_POLL_S):
            self.collect()

    def collect(self) -> None:
        for name, status in self.policies.statuses().items():
            samples = (status.get("policyState") or {}).get("arrivals") or []
            self.times.setdefault(name, set()).update(float(t) for t, _ in samples)
        self.polls += 1

    def periods(self, start: float, end: float) -> dict[str, list[float]]:
        """Per policy, the gaps between consecutive decisions that both fell in [start, end]."""
        found: dict[str, list[float]] = {}
        for name, times in self.times.items():
            inside = sorted(t for t in times if start <= t <= end)
            found[name] = [b - a for a, b in itertools.pairwise(inside)]
        return found


class Flipper:
    """Switches the router to the fastest configuration every few seconds, from outside."""

    def __init__(self, router: TritonRouter, every_s: float) -> None:
        self.router, self.every_s = router, every_s
        self.flips: list[float] = []
        self.recoveries: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flipper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        accurate = config_key(ACCURATE)
        while not self._stop.is_set():
            self.router.switch(FASTEST)
            flipped = time.time()
            self.flips.append(flipped)
            while not self._stop.is_set() and time.time() - flipped < self.every_s:
                if self.router.active_config() == accurate:
                    self.recoveries.append(time.time() - flipped)
                    self._stop.wait(max(0.0, self.every_s - (time.time() - flipped)))
                    break
                time.sleep(0.05)


def acting(operator: Operator) -> set[str]:
    """The policies this operator process has acted on (set their gauges: each tick does)."""
    try:
        text = operator.metrics()
    except OSError:
        return set()
    return {
        line.split('policy="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("compass_policy_ready{")
    }


def gauge_value(operator: Operator, name: str) -> float | None:
    """One unlabelled gauge of the operator's /metrics."""
    for line in operator.metrics().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def restart_phase(
    operator: Operator, policies: Policies, pids: dict[str, int], limit_s: float
) -> dict[str, Any]:
    """SIGKILL the operator, start a new one: seconds until every policy has acted again."""
    count = len(policies.names)
    print(f"restart: {count} policies, the operator killed", file=sys.stderr, flush=True)
    operator.kill()
    started = time.time()
    operator.start()
    pids["operator"] = operator.pid
    alive = time.time() - started
    seen: list[tuple[float, int]] = []
    while time.time() - started < limit_s:
        found = len(acting(operator) & set(policies.names))
        seen.append((time.time() - started, found))
        if found >= count:
            break
        time.sleep(0.5)
    done = seen[-1][1] >= count if seen else False
    return {
        "label": f"restart-{count}",
        "policies": count,
        "alive_s": alive,
        "all_acting_s": seen[-1][0] if done else None,
        "acting_at_end": seen[-1][1] if seen else 0,
        "half_acting_s": next((t for t, n in seen if n >= count / 2), None),
        "progress": seen[:: max(1, len(seen) // 20)],
    }


def churn_phase(
    cluster: Cluster,
    operator: Operator,
    policies: Policies,
    pids: dict[str, int],
    window_s: float,
    churn: int,
    body_of: Any,
) -> dict[str, Any]:
    """While the others tick, create ``churn`` policies and delete ``churn`` old ones; then
    check that nothing of the deleted is left (objects, series, scheduled ticks)."""
    from kubernetes import client

    count = len(policies.names)
    created = [f"c{index:04d}" for index in range(churn)]
    deleted = policies.names[:churn]
    api = client.CustomObjectsApi(cluster.api_client())
    print(f"churn: +{churn} -{churn} beside {count}", file=sys.stderr, flush=True)

    def churn_now() -> None:
        for new, old in zip(created, deleted, strict=True):
            policies.create(body_of(new))
            api.delete_namespaced_custom_object(
                GROUP, VERSION, policies.namespace, POLICY_PLURAL, old, _preload_content=False
            )
            policies.names.remove(old)
            time.sleep(window_s / 2 / churn)

    thread = threading.Thread(target=churn_now, daemon=True)
    thread.start()
    result = measure(f"churn-{count}", count, window_s, operator, policies, pids, cluster=cluster)
    thread.join()
    time.sleep(SERIES_GONE_S)
    remaining = set(policies.statuses())
    series = acting(operator)
    result.update(
        {
            "created": churn,
            "deleted": churn,
            "deleted_objects_left": sorted(set(deleted) & remaining),
            "deleted_series_left": sorted(set(deleted) & series),
            "created_acting": len(set(created) & series),
            "scheduled": gauge_value(operator, "compass_policies_scheduled"),
            "objects": len(remaining),
        }
    )
    return result


def apiserver_writes(cluster: Cluster) -> dict[str, float]:
    """Requests the API server has answered so far that write (POST, PUT, PATCH, DELETE): all,
    and the ParetoPolicies' status patches (its own /metrics)."""
    request = urllib.request.Request(
        f"{cluster.server}/metrics", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    with urllib.request.urlopen(request, context=cluster._ssl_context(), timeout=10) as answer:
        text = answer.read().decode()
    writes = {"all": 0.0, "policy_status": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if not sample.name.endswith("_total") or labels.get("verb") not in WRITE_VERBS:
                continue
            writes["all"] += sample.value
            if labels.get("resource") == POLICY_PLURAL and labels.get("subresource") == "status":
                writes["policy_status"] += sample.value
    return writes


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def measure(
    label: str,
    count: int,
    window_s: float,
    operator: Operator,
    policies: Policies,
    pids: dict[str, int],
    flipper: Flipper | None = None,
    py_spy_s: float = 0.0,
    cluster: Cluster | None = None,
) -> dict[str, Any]:
    """One window: CPU, RSS, decision periods and decision latency of the operator, and the API
    server's writes a second."""
    print(f"measuring {label}: {count} policies for {window_s:.0f} s", file=sys.stderr, flush=True)
    writes0 = None if cluster is None else apiserver_writes(cluster)
    metrics0, cpu0, start = operator.metrics(), cpu_of(pids), time.time()
    spy = None
    if py_spy_s > 0:
        out = OUT_DIR / f"operator_scale_{label}.pyspy.txt"
        spy = subprocess.Popen(
            [shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy", "record", "-d", str(int(py_spy_s)), "-p", str(operator.pid),
             "-o", str(out), "--format", "raw", "--threads", "--idle", "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
    rss: list[float] = []
    with DecisionTimes(policies) as times, flipper or contextlib.nullcontext():
        while time.time() - start < window_s:
            rss.append(rss_mib(operator.pid))
            time.sleep(min(2.0, max(0.0, window_s - (time.time() - start))))
        end = time.time()
        metrics1, cpu1 = operator.metrics(), cpu_of(pids)
        writes1 = None if cluster is None else apiserver_writes(cluster)
    if spy is not None:
        spy.wait(timeout=py_spy_s + 60)
    elapsed = end - start
    cpu = {name: 100.0 * (cpu1[name] - cpu0[name]) / elapsed for name in pids}
    latency = histogram(metrics1, "compass_decision_seconds").minus(
        histogram(metrics0, "compass_decision_seconds")
    )
    per_policy = times.periods(start, end)
    gaps = [gap for found in per_policy.values() for gap in found]
    medians = {n: statistics.median(g) for n, g in per_policy.items() if g}
    switches = counter_total(metrics1, "compass_switches") - counter_total(
        metrics0, "compass_switches"
    )
    result = {
        "label": label,
        "policies": count,
        "window_s": elapsed,
        "cpu_percent": cpu,
        "rss_mib": max(rss),
        "decisions": latency.count,
        "decisions_per_s": latency.count / elapsed,
        "decision_latency_s": {
            "mean": latency.mean(),
            "p50": latency.quantile(0.5),
            "p95": latency.quantile(0.95),
            "p99": latency.quantile(0.99),
            "buckets": latency.buckets,
        },
        "period_s": {
            "median": percentile(gaps, 0.5),
            "p95": percentile(gaps, 0.95),
            "max": max(gaps) if gaps else None,
            "intervals": len(gaps),
            "policies_seen": len(medians),
            "over_1_5s": sum(1 for g in gaps if g > 1.5),
        },
        "policies_behind": sorted(n for n, m in medians.items() if m > BEHIND_S),
        "switches": switches,
        "status_polls": times.polls,
        "apiserver_writes_per_s": None
        if writes0 is None or writes1 is None
        else {k: (writes1[k] - writes0[k]) / elapsed for k in writes1},
    }
    if flipper is not None:
        result["flips"] = len(flipper.flips)
        result["recovery_s"] = {
            "median": percentile(flipper.recoveries, 0.5),
            "max": max(flipper.recoveries) if flipper.recoveries else None,
            "count": len(flipper.recoveries),
        }
    return result


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    """Start everything, measure each count, return the raw results."""
    workdir = Path(tempfile.mkdtemp(prefix="compass-operator-scale-"))
    if not args.keep_workdir:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    print(f"work directory {workdir}", file=sys.stderr, flush=True)
    with timed("control plane"):
        cluster = start_cluster(stack, workdir)
    with timed("tritonserver"):
        triton = start_triton(stack, workdir / "triton", active=ACCURATE)
    router = TritonRouter(triton.grpc_url, backoff_s=0.05)
    stack.callback(router.close)
    # One request, so Triton exports the router's request counters (the arrivals).
    router.infer({"sample": 0})
    namespace = create_namespace(cluster, "operator-scale")
    operator = Operator(
        cluster,
        namespace,
        workdir / "operator.log",
        env={"COMPASS_TRITON_ADDRESS_OVERRIDE": triton.grpc_url},
        verbose=False,
    )
    stack.callback(operator.stop)
    with timed("compass operator"):
        operator.start()
    pids = {
        "operator": operator.pid,
        "tritonserver": triton.pid,
        **{p.name: p.popen.pid for p in cluster._processes},
    }
    policies = Policies(cluster, namespace)
    results: list[dict[str, Any]] = []
    counts = [int(c) for c in args.counts.split(",")]
    for count in counts:
        with timed(f"{count} policies created and Ready"):
            for index in range(len(policies.names), count):
                body = policy_body(
                    f"p{index:03d}",
                    triton.metrics_url,
                    triton.grpc_url,
                    args.strategy,
                )
                policies.create(body)
            ready = functools.partial(policies.all_ready, count)
            wait_for(ready, 60 + count, f"{count} policies Ready", 1.0)
        time.sleep(args.settle)
        spy = args.py_spy if count == counts[-1] else 0.0
        results.append(measure(f"steady-{count}", count, args.window, operator, policies, pids,
                               py_spy_s=spy, cluster=cluster))  # fmt: skip
    if args.huge_workflows > 0:
        with timed(f"{args.huge_workflows} huge workflows created"):
            create_huge_workflows(cluster, namespace, args.huge_workflows)
            time.sleep(args.settle)
        result = measure(
            f"huge-{counts[-1]}", counts[-1], args.window, operator, policies, pids, cluster=cluster
        )
        result["workflows"] = workflow_conditions(cluster, namespace)
        results.append(result)
    if args.churn > 0:
        body_of = functools.partial(
            policy_body,
            metrics_url=triton.metrics_url,
            grpc_url=triton.grpc_url,
            strategy=args.strategy,
        )
        results.append(
            churn_phase(cluster, operator, policies, pids, args.window, args.churn, body_of)
        )
    if args.restart:
        results.append(restart_phase(operator, policies, pids, args.restart_limit))
        # The new process, in steady state again.
        time.sleep(args.settle)
        count = len(policies.names)
        results.append(measure(f"after-restart-{count}", count, args.window, operator, policies,
                               pids, cluster=cluster))  # fmt: skip
    if not args.no_switch_phase:
        with timed("cooldown patched"):
            for name in policies.names:
                policies.patch_spec(
                    name, {"hysteresis": {"downscaleCooldownSeconds": SWITCH_COOLDOWN_S}}
                )
            time.sleep(args.settle)
        flipper = Flipper(TritonRouter(triton.grpc_url, backoff_s=0.05), args.flip_every)
        stack.callback(flipper.router.close)
        results.append(
            measure(f"switching-{counts[-1]}", counts[-1], args.window, operator, policies, pids,
                    flipper=flipper, py_spy_s=args.py_spy, cluster=cluster)
        )  # fmt: skip
        router.switch(ACCURATE)
    errors = operator.metrics()
    return {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        },
        "behind_threshold_s": BEHIND_S,
        "results": results,
        "operator_errors": [
            line for line in errors.splitlines() if line.startswith("compass_errors_total{")
        ],
        "operator_log_tail": operator.tail(20),
    }


def print_table(data: dict[str, Any]) -> None:
    """The short table."""
    print(
        f"{'phase':<18}{'op CPU %':>9}{'RSS MiB':>9}{'dec/s':>7}{'period p50':>11}"
        f"{'p95':>7}{'max':>7}{'behind':>10}{'lat p50 ms':>11}{'p95 ms':>8}"
        f"{'apisrv %':>9}{'writes/s':>9}{'triton %':>9}{'switches':>9}"
    )
    for r in data["results"]:
        if "period_s" not in r:
            continue
        period, latency, cpu = r["period_s"], r["decision_latency_s"], r["cpu_percent"]
        ms = [None if v is None else v * 1000 for v in (latency["p50"], latency["p95"])]
        writes = (r.get("apiserver_writes_per_s") or {}).get("all")
        print(
            f"{r['label']:<18}{cpu['operator']:>9.1f}{r['rss_mib']:>9.0f}"
            f"{r['decisions_per_s']:>7.1f}{fmt(period['median'], '.3f'):>11}"
            f"{fmt(period['p95'], '.2f'):>7}{fmt(period['max'], '.2f'):>7}"
            f"{len(r['policies_behind']):>5}/{r['policies']:<4}{fmt(ms[0]):>10}{fmt(ms[1]):>8}"
            f"{cpu['kube-apiserver']:>9.1f}{fmt(writes):>9}{cpu['tritonserver']:>9.1f}"
            f"{r['switches']:>9.0f}"
        )
    for r in data["results"]:
        for name, state in sorted(r.get("workflows", {}).items()):
            print(f"{r['label']}: workflow {name}: {state}")
        if "flips" in r:
            rec = r["recovery_s"]
            print(
                f"{r['label']}: {r['flips']} flips from outside, {r['switches']:.0f} switches by "
                f"the operator, back on the accurate configuration after "
                f"{fmt(rec['median'], '.2f')} s median, {fmt(rec['max'], '.2f')} s max "
                f"(cooldown {SWITCH_COOLDOWN_S:.0f} s)"
            )
        if "all_acting_s" in r:
            print(
                f"{r['label']}: the new process alive after {r['alive_s']:.1f} s, half the "
                f"policies acting after {fmt(r['half_acting_s'])} s, all {r['policies']} after "
                f"{fmt(r['all_acting_s'])} s ({r['acting_at_end']} acting at the end)"
            )
        if "deleted_objects_left" in r:
            print(
                f"{r['label']}: +{r['created']} created ({r['created_acting']} acting), "
                f"-{r['deleted']} deleted: {len(r['deleted_objects_left'])} objects and "
                f"{len(r['deleted_series_left'])} series of them left; {r['objects']} policies, "
                f"{fmt(r['scheduled'], '.0f')} on the scheduler"
            )


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,10,100", help="policy counts, increasing")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per count")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before each window")
    parser.add_argument("--flip-every", type=float, default=6.0, help="switch phase: seconds")
    parser.add_argument("--no-switch-phase", action="store_true")
    parser.add_argument("--huge-workflows", type=int, default=2, help="huge phase: workflows")
    parser.add_argument("--py-spy", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument(
        "--churn", type=int, default=0, help="churn phase: create and delete this many"
    )
    parser.add_argument(
        "--restart", action="store_true", help="restart phase: kill the operator, start another"
    )
    parser.add_argument("--restart-limit", type=float, default=120.0, help="restart: give up after")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and etcd data")
    parser.add_argument("--out", default="operator_scale.json", help="file name in bench/out/")
    add_enum_argument(
        parser,
        "--strategy",
        Strategy.ELASTICO,
        "every policy's strategy (predictive runs its forecast each decision)",
    )
    args = parser.parse_args()
    # The spec model says what the API server will refuse before a cluster is started for
    # nothing.
    sample = policy_body("p", "http://triton:8002/metrics", "triton:8001", args.strategy)["spec"]
    try:
        ParetoPolicySpec.model_validate(sample)
    except ValidationError as error:
        parser.error(explain_validation_error(error))
    return run_benchmark(args, run, print_table)


if __name__ == "__main__":
    sys.exit(main())

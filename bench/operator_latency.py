"""The operator's latencies: a CompoundWorkflow to a Ready ParetoPolicy, and Elastico's decision
to the router serving the new configuration.

    python bench/operator_latency.py [--repeats 3] [--poll-interval 5] [--cycles 4]
                                     [--reloads 10] [--skip-workflow] [--skip-switch]

Everything is real: etcd, kube-apiserver and kube-controller-manager (compass_dev.devcluster), the
node helper running the Jobs' pods as local processes (compass_dev.devnode), one tritonserver
serving rag-sim at a tenth of its latencies, and one `compass operator` process.

(a) `kubectl apply` of a rag-sim CompoundWorkflow with a REPLAY evaluator (the 16-configuration
corner of the paper's RAG grid, as tests/k8s/test_workflow_controller.py) until its ParetoPolicy
is Ready, --repeats times. The workflow's status is polled every 0.1 s, so each phase (operator
reaction, search Job, profiling Job, planning, the policy's first decision) is timed from when
it was first seen; the Jobs' pods give their own run times. The operator polls an active
workflow every COMPASS_POLL_INTERVAL_SECONDS (--poll-interval; the product default is 5 s).

(b) One ParetoPolicy on the router; --cycles times: a load past both configurations' capacity
(55 requests/s for 3 s) makes Elastico switch to the fastest configuration, and once the queue
has drained it climbs back after its 2 s cooldown. Per switch: from the decision (the tick time
the operator records as status.lastSwitchTime, with milliseconds) to the router serving the
new configuration (its model config polled over gRPC every 10 ms), and to the first reply
served by it (the load's replies, and a probe's: 5 requests/s throughout). First, --reloads switches made directly
by this script time the router reload itself. Raw results go to bench/out/operator_latency.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from compass.controllers.builders import LEDGER_KEY
from compass.controllers.policy_status import parse_rfc3339
from compass.dataplane.load import RequestRecord, run_load
from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass.examples import build_replay_ledger, load_rag_paper
from compass_dev.devcluster import Cluster, Operator
from compass_dev.devnode import Node
from compass_dev.local_triton import LocalTriton
from compass_dev.podenv import LocalImage
from compass_dev.processes import venv_executable, wait_for
from compass_dev.scenarios import RAG_CORNER_SPACE
from operator_common import (
    ACCURATE,
    FASTEST,
    GROUP,
    POLICY_PLURAL,
    VERSION,
    WORKFLOW_PLURAL,
    create_namespace,
    fmt,
    percentile,
    rag_sim_policy,
    run_benchmark,
    start_cluster,
    start_triton,
    timed,
)

SAMPLES = 100
PHASES = ("Pending", "Searching", "Profiling", "Planning", "Ready")
LOAD_QPS, LOAD_S = 55.0, 3.0
# Light enough that the most accurate configuration stays within its limits (its capacity is
# ~30 requests/s here): the policy climbs back while the probe runs.
PROBE_QPS = 5.0
COOLDOWN_S = 2.0
POLL_S = 0.1
ROUTER_POLL_S = 0.01


def replay_ledger() -> str:
    """The recorded ledger of the subspace (the paper's accuracies replayed over samples)."""
    _, rows = load_rag_paper()
    values = {p["name"]: p["values"] for p in RAG_CORNER_SPACE["parameters"]}
    chosen = [r for r in rows if all(r["config"][k] in v for k, v in values.items())]
    return "".join(json.dumps(line) + "\n" for line in build_replay_ledger(chosen, SAMPLES, 7))


def workflow(name: str, grpc_port: int, metrics_port: int) -> dict[str, Any]:
    """A rag-sim CompoundWorkflow whose search replays the ledger (tau 0.82, SLO 300 ms).

    Triton is named by its loopback address: the generated policy reads the metrics from
    http://<service>:<metricsPort>, which COMPASS_TRITON_ADDRESS_OVERRIDE (gRPC only) does not
    redirect, and no Service resolves here."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": name},
        "spec": {
            "space": RAG_CORNER_SPACE,
            "evaluation": {
                "dataset": {"size": SAMPLES, "imagePath": "/data/rag.jsonl"},
                "tau": 0.82,
                "evaluator": {"type": "replay", "replayConfigMap": "rag-ledger"},
            },
            "search": {"backoffLimit": 1},
            "profiling": {"warmupRuns": 1, "measuredRuns": 8},
            "slo": {"latencyMs": 300},
            "triton": {
                "service": "127.0.0.1",
                "grpcPort": grpc_port,
                "metricsPort": metrics_port,
                "routerModel": "router",
            },
        },
    }


def policy_body(name: str, metrics_url: str, grpc_url: str) -> dict[str, Any]:
    """The benchmark's ParetoPolicy on the shared rag-sim router."""
    return rag_sim_policy(name, metrics_url, grpc_url, COOLDOWN_S)


class Api:
    """The few reads and deletes the benchmark needs, in one namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        from kubernetes import client

        api = cluster.api_client()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        response: Any
        try:
            response = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name, _preload_content=False
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(json.loads(response.data))

    def create(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, plural, body, _preload_content=False
        )

    def delete(self, plural: str, name: str) -> None:
        with contextlib.suppress(Exception):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name,
                propagation_policy="Background", _preload_content=False,
            )  # fmt: skip

    def pods(self, selector: str) -> list[dict[str, Any]]:
        response: Any = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector, _preload_content=False
        )
        return list(json.loads(response.data)["items"])


def _gone(api: Api, policy: str) -> bool:
    return api.get(POLICY_PLURAL, policy) is None


def _ready(status: dict[str, Any]) -> bool:
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    return bool(conditions.get("Ready", {}).get("status") == "True")


def _pod_run_s(api: Api, job: str) -> float | None:
    """How long the Job's (last) pod ran, from its container's start and finish (1 s steps)."""
    for pod in reversed(api.pods(f"job-name={job}")):
        for container in pod.get("status", {}).get("containerStatuses") or []:
            done = container.get("state", {}).get("terminated") or {}
            started, finished = (
                parse_rfc3339(done.get("startedAt")),
                parse_rfc3339(done.get("finishedAt")),
            )
            if started is not None and finished is not None:
                return finished - started
    return None


def workflow_to_policy(
    cluster: Cluster, api: Api, name: str, triton: LocalTriton, timeout_s: float
) -> dict[str, Any]:
    """kubectl apply one workflow; the time each phase was first seen, until its policy is Ready."""
    body = workflow(name, triton.grpc_port, triton.metrics_port)
    manifest = yaml.safe_dump(body, sort_keys=False)
    applied = time.time()
    cluster.kubectl("apply", "--namespace", api.namespace, "-f", "-", input=manifest)
    seen: dict[str, float] = {}
    policy_name = None
    status: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    deadline = applied + timeout_s
    while time.time() < deadline:
        body = api.get(WORKFLOW_PLURAL, name) or {}
        status = body.get("status") or {}
        phase = status.get("phase")
        now = time.time()
        if phase and phase not in seen:
            seen[phase] = now
        if phase == "Failed":
            raise RuntimeError(f"workflow {name} failed: {status.get('conditions')}")
        policy_name = status.get("policy") or policy_name
        if phase == "Ready" and policy_name:
            policy = api.get(POLICY_PLURAL, policy_name) or {}
            if _ready(policy.get("status") or {}):
                seen["PolicyReady"] = now
                break
        time.sleep(POLL_S)
    else:
        raise TimeoutError(
            f"workflow {name} not Ready with a Ready policy in {timeout_s:.0f} s; workflow "
            f"status {json.dumps(status)}; policy status {json.dumps(policy.get('status'))}"
        )
    # A phase shorter than the poll was not seen: it counts in the one seen after it.
    order = [p for p in (*PHASES, "PolicyReady") if p in seen]
    marks = [("applied", applied), *((p, seen[p]) for p in order)]
    phases = {f"{a}->{b}": t1 - t0 for (a, t0), (b, t1) in itertools.pairwise(marks)}
    final = api.get(WORKFLOW_PLURAL, name) or {}
    status = final.get("status") or {}
    return {
        "workflow": name,
        "total_s": seen["PolicyReady"] - applied,
        "phases_s": phases,
        "search_pod_s": _pod_run_s(api, status.get("searchJob") or ""),
        "profiling_pod_s": _pod_run_s(api, status.get("profilingJob") or ""),
        "configurations_evaluated": status.get("configurationsEvaluated"),
        "feasible_found": status.get("feasibleFound"),
        "policy": policy_name,
        "conditions": status.get("conditions"),
    }


def reload_times(router: TritonRouter, count: int) -> list[float]:
    """Seconds per router switch (one control-model request), alternating, no load."""
    times = []
    for index in range(count):
        report = router.switch(ACCURATE if index % 2 else FASTEST)
        times.append(report.seconds)
    return times


class Watch:
    """Background pollers: the router's configuration (gRPC), the policy's lastSwitchTime, and
    a probe load whose replies say which configuration served them."""

    def __init__(self, grpc_url: str, api: Api, policy: str) -> None:
        self.router = TritonRouter(grpc_url, backoff_s=0.05)
        self.api, self.policy = api, policy
        self.router_changes: list[tuple[float, str]] = []
        self.decisions: dict[str, float] = {}  # lastSwitchTime -> seen
        self.replies: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._router, daemon=True),
            threading.Thread(target=self._status, daemon=True),
            threading.Thread(target=self._probe, daemon=True),
        ]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self.router.close()

    def _router(self) -> None:
        last = None
        while not self._stop.wait(ROUTER_POLL_S):
            key = self.router.active_config()
            if key != last:
                self.router_changes.append((time.time(), key))
                last = key

    def _status(self) -> None:
        while not self._stop.wait(POLL_S):
            status = (self.api.get(POLICY_PLURAL, self.policy) or {}).get("status") or {}
            stamp = status.get("lastSwitchTime")
            if stamp and stamp not in self.decisions:
                self.decisions[stamp] = time.time()

    def _probe(self) -> None:
        while not self._stop.is_set():
            started = time.time()
            arrivals = [i / PROBE_QPS for i in range(int(PROBE_QPS))]
            records = run_load(self.router.url, arrivals, lambda i: {"sample": i})
            self.replies.extend((started + r.sent_s + r.latency_s, r.config or "") for r in records)


def load(grpc_url: str) -> list[RequestRecord]:
    """LOAD_QPS requests a second for LOAD_S seconds, evenly spaced."""
    arrivals = [i / LOAD_QPS for i in range(int(LOAD_QPS * LOAD_S))]
    return run_load(grpc_url, arrivals, lambda i: {"sample": i % 100})


def decision_to_routing(grpc_url: str, metrics_url: str, api: Api, cycles: int) -> dict[str, Any]:
    """Switch cycles driven by load; per switch, decision -> router and -> first reply."""
    name = "elastico-latency"
    api.create(POLICY_PLURAL, policy_body(name, metrics_url, grpc_url))
    accurate, fastest = config_key(ACCURATE), config_key(FASTEST)
    with Watch(grpc_url, api, name) as watch:
        wait_for(
            lambda: watch.router_changes and watch.router_changes[-1][1] == accurate,
            30,
            "the policy to serve the accurate configuration",
        )
        for cycle in range(cycles):
            print(f"  switch cycle {cycle + 1}/{cycles}", file=sys.stderr, flush=True)
            started = time.time()
            records = load(grpc_url)
            watch.replies.extend(
                (started + r.sent_s + r.latency_s, r.config or "") for r in records
            )
            wait_for(
                lambda: watch.router_changes[-1][1] == accurate and time.time() - watch.router_changes[-1][0] > 1.0,
                90,
                "the climb back to the accurate configuration",
            )  # fmt: skip
        time.sleep(1.0)
    api.delete(POLICY_PLURAL, name)
    switches = []
    for stamp, seen in sorted(watch.decisions.items()):
        decided = parse_rfc3339(stamp)
        assert decided is not None
        routed = next(((t, k) for t, k in watch.router_changes if t >= decided), None)
        if routed is None:
            continue
        replied = min(
            (t for t, k in watch.replies if t >= decided and k == routed[1]), default=None
        )
        switches.append(
            {
                "decided": decided,
                "to": "fastest" if routed[1] == fastest else "accurate",
                "router_s": routed[0] - decided,
                "first_reply_s": None if replied is None else replied - decided,
                "status_seen_s": seen - decided,
            }
        )
    return {"switches": switches, "router_changes": watch.router_changes}


def summary(values: list[float]) -> dict[str, float | None]:
    """Median and max (None when empty)."""
    return {
        "median": percentile(values, 0.5),
        "max": max(values) if values else None,
        "n": len(values),
    }


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    """Start everything, measure (a) and (b), return the raw results."""
    workdir = Path(tempfile.mkdtemp(prefix="compass-operator-latency-"))
    if not args.keep_workdir:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    print(f"work directory {workdir}", file=sys.stderr, flush=True)
    with timed("control plane"):
        cluster = start_cluster(stack, workdir)
    # The node's pods (the Jobs' `compass job ...`) inherit this process's environment.
    os.environ.update(cluster.env())
    with timed("tritonserver"):
        triton = start_triton(stack, workdir / "triton", active=ACCURATE)
    compass = venv_executable("compass")
    images = {
        "compass-operator": LocalImage(entrypoint=[compass], executables={"compass": compass})
    }
    stack.enter_context(Node(cluster.api_client(), workdir / "node", images=images))
    namespace = create_namespace(cluster, "operator-latency")
    api = Api(cluster, namespace)
    ledger: Any = {"metadata": {"name": "rag-ledger"}, "data": {LEDGER_KEY: replay_ledger()}}
    api.core.create_namespaced_config_map(namespace, ledger, _preload_content=False)
    operator = Operator(
        cluster,
        namespace,
        workdir / "operator.log",
        verbose=False,
        env={
            "COMPASS_POLL_INTERVAL_SECONDS": str(args.poll_interval),
            "COMPASS_IMAGE": "ghcr.io/compass-operator/compass-operator:bench",
        },
    )
    stack.callback(operator.stop)
    with timed("compass operator"):
        operator.start()
    results: dict[str, Any] = {"poll_interval_s": args.poll_interval}
    router = TritonRouter(triton.grpc_url, backoff_s=0.05)
    stack.callback(router.close)
    if not args.skip_workflow:
        runs = []
        for index in range(args.repeats):
            name = f"rag-{index + 1}"
            with timed(f"workflow {name} to a Ready policy"):
                runs.append(workflow_to_policy(cluster, api, name, triton, args.timeout))
            # Its policy would switch the shared router: remove it before the next run.
            api.delete(WORKFLOW_PLURAL, name)
            if runs[-1]["policy"]:
                api.delete(POLICY_PLURAL, runs[-1]["policy"])
            gone = functools.partial(_gone, api, str(runs[-1]["policy"]))
            wait_for(gone, 60, f"the policy of {name} to go")
        results["workflow"] = runs
    if not args.skip_switch:
        router.switch(ACCURATE)
        with timed(f"{args.reloads} direct router switches"):
            results["reload_s"] = reload_times(router, args.reloads)
        router.switch(ACCURATE)
        with timed(f"{args.cycles} load cycles"):
            results["elastico"] = decision_to_routing(
                triton.grpc_url, triton.metrics_url, api, args.cycles
            )
    results["operator_log_tail"] = operator.tail(20)
    return results


def print_tables(data: dict[str, Any]) -> None:
    """The short tables."""
    runs = data.get("workflow") or []
    if runs:
        print(
            f"(a) CompoundWorkflow -> Ready ParetoPolicy (operator poll interval "
            f"{data['poll_interval_s']:g} s), seconds"
        )
        keys = sorted({k for r in runs for k in r["phases_s"]}, key=_phase_order)
        print(
            f"{'run':<7}{'total':>7}"
            + "".join(f"{k:>22}" for k in keys)
            + f"{'search pod':>12}{'profile pod':>12}"
        )
        for r in runs:
            cells = "".join(f"{fmt(r['phases_s'].get(k)):>22}" for k in keys)
            print(
                f"{r['workflow']:<7}{r['total_s']:>7.1f}{cells}"
                f"{fmt(r['search_pod_s'], '.0f'):>12}{fmt(r['profiling_pod_s'], '.0f'):>12}"
            )
    if "reload_s" in data:
        reload = summary(data["reload_s"])
        print(
            f"(b) router switch (switch() over gRPC, no load): median "
            f"{fmt(_ms(reload['median']), '.0f')} ms, max {fmt(_ms(reload['max']), '.0f')} ms "
            f"over {reload['n']}"
        )
    switches = (data.get("elastico") or {}).get("switches") or []
    if switches:
        print(f"{'':4}{'switch':<10}{'n':>3}{'decision->router ms':>22}{'->first reply ms':>18}")
        for direction in ("fastest", "accurate", "all"):
            chosen = [s for s in switches if direction in ("all", s["to"])]
            router = summary([s["router_s"] for s in chosen])
            reply = summary([s["first_reply_s"] for s in chosen if s["first_reply_s"] is not None])
            print(
                f"{'':4}{'to ' + direction:<10}{router['n']:>3}"
                f"{fmt(_ms(router['median']), '.0f'):>11} /{fmt(_ms(router['max']), '.0f'):>6} max"
                f"{fmt(_ms(reply['median']), '.0f'):>9} /{fmt(_ms(reply['max']), '.0f'):>6} max"
            )


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def _phase_order(key: str) -> int:
    order = ["applied", *PHASES, "PolicyReady"]
    return order.index(key.split("->")[1])


def main() -> int:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="(a) workflows, one after another")
    parser.add_argument("--poll-interval", type=float, default=5.0, help="(a) operator poll, s")
    parser.add_argument("--timeout", type=float, default=180.0, help="(a) per workflow, s")
    parser.add_argument("--cycles", type=int, default=4, help="(b) load cycles (2 switches each)")
    parser.add_argument("--reloads", type=int, default=10, help="(b) direct router reloads")
    parser.add_argument("--skip-workflow", action="store_true")
    parser.add_argument("--skip-switch", action="store_true")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and etcd data")
    parser.add_argument("--out", default="operator_latency.json", help="file name in bench/out/")
    return run_benchmark(parser.parse_args(), run, print_tables)


if __name__ == "__main__":
    sys.exit(main())

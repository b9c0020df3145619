"""The search Job at the fleet's speed (issue 44): concurrency 8 over a 2-replica Triton.

The real `compass operator` process runs CompoundWorkflows whose evaluator is triton; the node
helper runs their search Jobs' pods and two rag-sim tritonservers as a Deployment's pods, each
bound to its own pod IP. There is no kube-proxy, so the operator's override hands the Jobs both
pods' gRPC addresses, comma-separated, as the Service's load balancing would spread them.

One story: the search at the default concurrency (the fleet's: 2 pods x 4 router instances =
8, batch 4) reaches both pods and ends with the feasible set, the verdicts and the ledger's
facts of the search at concurrency 1 (batch 4); a third
search at concurrency 8 whose pod is deleted mid-search resumes from its ledger in the state
ConfigMap, records no (configuration, sample) twice and ends with the same result again.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, wait_for
from e2e_shared import Workflows
from operator_process import Operator
from test_triton_pods import GRPC_PORT, HTTP_PORT, IMAGE, START_S, TritonPods

from compass.api.meta import DEFAULT_ROUTER_MODEL, GROUP, VERSION, WORKFLOW_PLURAL
from compass.controllers.builders import RESULT_KEY
from compass.controllers.ledgerchunks import ledger_text
from compass_dev.devnode import Node
from compass_dev.local_triton import TritonInstallation
from compass_dev.podenv import LocalImage
from compass_dev.scenarios import FASTEST, RAG_CORNER_SPACE, TEST_TIME_SCALE, rag_sim_triton
from tiers import require_tritonserver

ROUTER_INSTANCES = 4  # per pod: 2 pods x 4 = the concurrency 8 keeps busy (docs/operations.md)
CONCURRENCY, BATCH = 8, 4
SAMPLES, BUDGETS, TAU = 40, [8, 16, 40], 0.8
SEARCH_S = 90  # a search of the corner subspace, another beside it, on 2 busy cores

Fact = tuple[str, int, float]


@pytest.fixture(scope="module")
def wide_rag_image(k8s_node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """IMAGE on the node with ROUTER_INSTANCES router instances (requests served at once)."""
    require_tritonserver()
    installation = TritonInstallation.find()
    workdir = tmp_path_factory.mktemp("rag-sim-wide")
    server = rag_sim_triton(workdir, TEST_TIME_SCALE, FASTEST, router_instances=ROUTER_INSTANCES)
    entrypoint = installation.server_command(server.repository)
    k8s_node.images[IMAGE] = LocalImage(entrypoint=entrypoint, env=installation.environment())
    yield IMAGE
    del k8s_node.images[IMAGE]


def _workflow(name: str, concurrency: int | None) -> dict[str, Any]:
    """The search of the story; concurrency None: the default, the fleet's."""
    workflow = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": name},
        "spec": {
            "space": RAG_CORNER_SPACE,
            "evaluation": {
                "dataset": {"size": SAMPLES, "imagePath": "/models/rag_sim.json"},
                "tau": TAU,
                "budgets": BUDGETS,
                "concurrency": concurrency,
                "batch": BATCH,
                "evaluator": {"type": "triton"},
            },
            "search": {"backoffLimit": 2},
            "slo": {"latencyMs": 1000},
            "triton": {"service": "rag", "routerModel": DEFAULT_ROUTER_MODEL},
        },
    }
    if concurrency is None:
        del workflow["spec"]["evaluation"]["concurrency"]
    return workflow


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def _facts(text: str) -> list[Fact]:
    """Every recorded score as (configuration, sample, score), as many times as recorded."""
    facts = []
    for line in text.splitlines():
        if line.strip():
            fact = json.loads(line)
            key = _key(fact["config"])
            facts += [
                (key, int(i), float(s))
                for i, s in zip(fact["samples"], fact["scores"], strict=True)
            ]
    return facts


def _outcome(result: dict[str, Any]) -> tuple[set[str], dict[str, tuple[str, float, int]]]:
    """The feasible set, and each evaluated configuration's verdict, accuracy and samples."""
    feasible = {_key(f["config"]) for f in result["feasible"]}
    verdicts = {
        _key(e["config"]): (e["verdict"], round(e["accuracy"], 9), e["samples"])
        for e in result["evaluated"]
    }
    return feasible, verdicts


def _inferences(ip: str) -> int:
    """Successful inferences of the router at one pod (Triton's own statistics)."""
    url = f"http://{ip}:{HTTP_PORT}/v2/models/{DEFAULT_ROUTER_MODEL}/stats"
    with urllib.request.urlopen(url, timeout=5) as response:
        stats = json.load(response)
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


class Searches:
    """The workflows' search state, read from the cluster."""

    def __init__(self, flows: Workflows) -> None:
        self.flows = flows

    def result(self, name: str) -> dict[str, Any] | None:
        maps = self.flows.config_maps(name)
        states = [m for m in maps if m["metadata"]["name"] == f"{name}-search-g1"]
        data = (states[0].get("data") or {}) if states else {}  # not made yet: no result
        return json.loads(data[RESULT_KEY]) if RESULT_KEY in data else None

    def facts(self, name: str) -> list[Fact]:
        return _facts(ledger_text(self.flows.config_maps(name)))

    def finish(self, name: str, timeout_s: float) -> tuple[dict[str, Any], list[Fact]]:
        """The search's result and ledger once its Job wrote them; then the workflow is
        deleted (the story ends with the search: no profiling beside the next searches)."""
        try:
            result = wait_for(lambda: self.result(name), timeout_s, f"{name}'s search", 0.2)
        except TimeoutError as error:
            pods = self.flows.pods(f"job-name={name}-search-g1")
            raise AssertionError(f"{error}: {self.flows.get(name).get('status')}\n{pods}") from None
        facts = self.facts(name)
        self.flows.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.flows.namespace, WORKFLOW_PLURAL, name,
            propagation_policy="Background",
        )  # fmt: skip
        return dict(result), facts


def test_concurrency_8_over_two_pods_matches_concurrency_1_and_resumes_after_a_kill(
    wide_rag_image: str,
    k8s_cluster: Cluster,
    k8s_api: Any,
    k8s_node: Node,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    rag = TritonPods(k8s_cluster, k8s_api, namespace, "rag")
    rag.create(2)
    try:
        ips = wait_for(lambda: rag.ready(2), START_S, "2 ready rag-sim pods", 0.2)
        addresses = ",".join(f"{ip}:{GRPC_PORT}" for ip in sorted(ips.values()))
        # The node runs the Jobs' pods with this process's environment (the kubeconfig).
        for key, value in k8s_cluster.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("COMPASS_TRITON_ADDRESS", raising=False)
        env = {"COMPASS_TRITON_ADDRESS_OVERRIDE": addresses, "COMPASS_POLL_INTERVAL_SECONDS": "0.5"}
        running = Operator(k8s_cluster, namespace, tmp_path / "operator.log", env=env).start()
        try:
            _story(k8s_node, namespace, Workflows(k8s_api, namespace), ips, started)
        except BaseException:
            print(f"operator log:\n{running.tail()}")  # pytest shows it when the test failed
            raise
        finally:
            running.stop()
    finally:
        rag.delete()


def _story(
    node: Node, namespace: str, flows: Workflows, ips: dict[str, str], started: float
) -> None:
    searches = Searches(flows)
    before = {ip: _inferences(ip) for ip in ips.values()}

    # The default concurrency, alone: the fleet's, 2 pods x their router's 4 instances, and
    # both pods answer its requests.
    flows.create(_workflow("wide", None))
    wait_for(lambda: searches.facts("wide"), 60, "wide's first ledger write", 0.05)
    [wide_pod] = flows.pods("job-name=wide-search-g1")
    wide, wide_facts = searches.finish("wide", SEARCH_S)
    wide_log = node.log(namespace, wide_pod["metadata"]["name"])
    fleet = f"{len(ips)} address(es) x {ROUTER_INSTANCES} router instance(s)"
    assert f"search: concurrency {CONCURRENCY} ({fleet}), batch {BATCH}" in wide_log, wide_log
    served = {ip: _inferences(ip) - before[ip] for ip in ips.values()}
    wide_s = time.monotonic() - started
    assert all(count > 0 for count in served.values()), f"requests per pod: {served}"
    assert sum(served.values()) >= wide["sample_evals"], (served, wide["sample_evals"])

    # Concurrency 1 and a concurrency 8 search whose pod is deleted once it has written its
    # ledger: the first evaluated batch is written at once (the next only seconds later), so
    # the kill lands mid-search whatever the machine's speed.
    flows.create(_workflow("narrow", 1))
    flows.create(_workflow("killed", CONCURRENCY))
    wait_for(lambda: searches.facts("killed"), 60, "killed's first ledger write", 0.05)
    [first] = flows.pods("job-name=killed-search-g1")
    assert searches.result("killed") is None, "the search ended before its pod could be killed"
    recorded_at_kill = len(searches.facts("killed"))
    flows.core.delete_namespaced_pod(first["metadata"]["name"], namespace, _preload_content=False)

    def resumed() -> str | None:
        pods = flows.pods("job-name=killed-search-g1")
        later = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
        return later[0]["metadata"]["name"] if later else None

    second = wait_for(resumed, 30, "the Job to replace the deleted pod", 0.2)
    narrow, narrow_facts = searches.finish("narrow", SEARCH_S)
    wait_for(lambda: searches.result("killed"), SEARCH_S, "killed's search", 0.2)
    log = node.log(namespace, second)  # read before the Job goes with its workflow
    killed, killed_facts = searches.finish("killed", 1)

    # The same answer at any concurrency: feasible set, verdicts, the ledger's facts as a set.
    assert _outcome(wide) == _outcome(narrow)
    assert wide["feasible"], "a feasible set to compare"
    assert {v for v, _, _ in _outcome(wide)[1].values()} != {"feasible"}, "and some rejected"
    assert wide["sample_evals"] == narrow["sample_evals"]
    assert set(wide_facts) == set(narrow_facts)
    assert len(wide_facts) == len(set(wide_facts)) == wide["sample_evals"]

    # The killed search resumed in a new pod and ended as the uninterrupted one did, with no
    # (configuration, sample) recorded twice.
    resuming = re.search(r"^resuming: (\d+) sample evaluations already recorded$", log, re.M)
    assert resuming is not None, log
    assert recorded_at_kill <= int(resuming.group(1)) < wide["sample_evals"], log
    given = "spec.evaluation.concurrency"
    assert f"search: concurrency {CONCURRENCY} ({given}), batch {BATCH}" in log, log
    assert _outcome(killed) == _outcome(wide)
    pairs = [(config, sample) for config, sample, _ in killed_facts]
    assert len(pairs) == len(set(pairs)), "a sample was recorded twice in the ledger"
    assert set(killed_facts) == set(wide_facts)
    print(
        f"concurrency {CONCURRENCY}: {wide['sample_evals']} sample evaluations, "
        f"{len(wide['feasible'])} feasible, requests per pod {served}, done {wide_s:.1f} s after "
        f"the pods were created; killed after {recorded_at_kill} recorded, resumed from "
        f"{resuming.group(1)}; all done in {time.monotonic() - started:.1f} s"
    )

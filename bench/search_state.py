"""Bytes the search Job sends to its state ConfigMaps: the RAG grid replayed at 100 and 1,000 samples.

Run as ``python bench/search_state.py [--samples 100,1000] [--tau 0.8] [--budgets 50,200,1000]
[--cluster]``. It runs the Job's own
``compass.commands.job.run_search`` in-process against an in-memory ConfigMap API
(``FakeConfigMaps``) that applies merge patches as the API server does, refuses a ConfigMap
whose data and binaryData exceed 1 MiB with the server's 422, and counts the JSON bytes of every
PATCH and POST body, and the bytes of the whole object each write leaves (what etcd stores as
a new revision). It touches nothing the Job's code does not, so the same script measures any
version of the package: ``PYTHONPATH=/work/main/operator python bench/search_state.py`` measures
main. The replay ConfigMap holds the embedded RAG grid (234 configurations, compass.examples)
replayed over the samples; it is set up directly, outside the counts and the limit.

``--cluster`` runs the same search against a real API server and etcd instead
(compass_dev.devcluster, its binaries cached in ~/.cache/compass-k8s; one control plane per
size): it counts the updates (every PATCH and POST of a ConfigMap), sums the size of each object
the server answers (data plus decoded binaryData: what etcd stores as a new revision), and reads
etcd's database size from its /metrics before and after. To measure another version, point
PYTHONPATH at its package (this version's dev/compass_dev stays installed: ``Cluster.etcd_url``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

# The API server's limit on a ConfigMap's data plus binaryData (corevalidation.MaxSecretSize).
CONFIG_MAP_LIMIT = 1024 * 1024
NAMESPACE = "bench"
STATE = "rag-search-g1"
REPLAY = "rag-ledger"


@dataclass
class Response:
    """What kubeapi.call reads of an answer given ``_preload_content=False``."""

    status: int
    data: bytes


@dataclass
class FakeConfigMaps:
    """CoreV1Api's ConfigMap calls over a dict; ``failures`` are raised by the next calls."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=lambda: {"patch": 0, "create": 0})
    # What etcd stores at each write: the whole object (its data and decoded binaryData).
    stored: int = 0
    requests: dict[str, int] = field(default_factory=lambda: {"patch": 0, "create": 0, "read": 0})
    failures: list[BaseException] = field(default_factory=list)

    def _fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    def _answer(self, obj: Any) -> Response:
        return Response(200, json.dumps(obj).encode())

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> Response:
        """GET."""
        self._fail()
        self.requests["read"] += 1
        if name not in self.objects:
            raise _error(404, "NotFound", f'configmaps "{name}" not found')
        return self._answer(self.objects[name])

    def patch_namespaced_config_map(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> Response:
        """A merge patch of data and binaryData (None deletes a key)."""
        self._fail()
        self.requests["patch"] += 1
        self.sent["patch"] += len(json.dumps(body))
        if name not in self.objects:
            raise _error(404, "NotFound", f'configmaps "{name}" not found')
        patched = json.loads(json.dumps(self.objects[name]))
        for part in ("data", "binaryData"):
            for key, value in (body.get(part) or {}).items():
                if value is None:
                    patched.setdefault(part, {}).pop(key, None)
                else:
                    patched.setdefault(part, {})[key] = value
        _check_size(patched)
        self.stored += size_of(patched)
        self.objects[name] = patched
        return self._answer(patched)

    def create_namespaced_config_map(
        self, namespace: str, body: dict[str, Any], **_: Any
    ) -> Response:
        """POST: 409 if the name is taken."""
        self._fail()
        self.requests["create"] += 1
        self.sent["create"] += len(json.dumps(body))
        name = body["metadata"]["name"]
        if name in self.objects:
            raise _error(409, "AlreadyExists", f'configmaps "{name}" already exists')
        _check_size(body)
        self.stored += size_of(body)
        self.objects[name] = json.loads(json.dumps(body))
        return self._answer(body)


def _error(status: int, reason: str, message: str) -> ApiException:
    error = ApiException(status=status, reason=reason)
    error.body = json.dumps({"kind": "Status", "message": message, "reason": reason})
    return error


def size_of(obj: dict[str, Any]) -> int:
    """The size the API server limits: data values' bytes plus binaryData's decoded bytes."""
    data = sum(len(v.encode()) for v in (obj.get("data") or {}).values())
    binary = sum(len(base64.b64decode(v)) for v in (obj.get("binaryData") or {}).values())
    return data + binary


def _check_size(obj: dict[str, Any]) -> None:
    if size_of(obj) > CONFIG_MAP_LIMIT:
        raise _error(422, "Invalid", f"ConfigMap: Too long: must have at most {CONFIG_MAP_LIMIT}")


@contextlib.contextmanager
def fake_api(api: FakeConfigMaps) -> Iterator[None]:
    """Every StateStore built meanwhile talks to ``api``."""
    from kubernetes import client

    from compass.controllers import kubeapi

    saved = client.CoreV1Api, kubeapi.load_client
    client.CoreV1Api = lambda *_: api  # type: ignore[assignment,misc]
    kubeapi.load_client = lambda: None  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        client.CoreV1Api, kubeapi.load_client = saved  # type: ignore[misc]


def rag_workflow(samples: int, tau: float, budgets: Sequence[int] = ()) -> dict[str, Any]:
    """A CompoundWorkflow over the embedded RAG grid, scored by the replay ConfigMap."""
    from compass.examples import load_rag_paper

    space, _ = load_rag_paper()
    # The looks below the dataset's size, then all of it (none: the adaptive default).
    looks = [b for b in budgets if b < samples] + [samples] if budgets else None
    return {
        "apiVersion": "compass.io/v1alpha1",
        "kind": "CompoundWorkflow",
        "metadata": {"name": "rag", "namespace": NAMESPACE, "uid": "u-rag", "generation": 1},
        "spec": {
            "space": space,
            "evaluation": {
                "dataset": {"size": samples, "imagePath": "/data/rag.jsonl"},
                "tau": tau,
                **({"budgets": looks} if looks else {}),
                "evaluator": {"type": "replay", "replayConfigMap": REPLAY},
            },
            "slo": {"latencyMs": 1000},
            "triton": {"service": "triton", "routerModel": "router"},
        },
    }


def replay_config_map(samples: int) -> dict[str, Any]:
    """The grid's recorded accuracies replayed over ``samples`` samples, as plain data."""
    from compass.controllers.builders import LEDGER_KEY
    from compass.examples import build_replay_ledger, load_rag_paper

    _, rows = load_rag_paper()
    text = "".join(json.dumps(line) + "\n" for line in build_replay_ledger(rows, samples, 7))
    return {"metadata": {"name": REPLAY, "namespace": NAMESPACE}, "data": {LEDGER_KEY: text}}


@dataclass
class Run:
    """One search's traffic to its state (bytes of request bodies; of objects stored)."""

    samples: int
    outcome: str
    patched: int
    created: int
    patches: int
    creates: int
    stored: int
    config_maps: int
    state: int
    largest: int
    seconds: float


def measure(samples: int, tau: float, budgets: Sequence[int] = ()) -> Run:
    """Run the Job's search once on a fresh fake API; what it sent."""
    from compass.api.compoundworkflow import CompoundWorkflowSpec
    from compass.commands import job
    from compass.controllers import builders

    workflow = rag_workflow(samples, tau, budgets)
    spec = CompoundWorkflowSpec.model_validate(workflow["spec"])
    api = FakeConfigMaps()
    api.objects[REPLAY] = replay_config_map(samples)
    for body in builders.build_state_config_maps(workflow, spec):
        api.objects[body["metadata"]["name"]] = body
    started = time.perf_counter()
    with fake_api(api), contextlib.redirect_stdout(io.StringIO()):
        try:
            job.run_search(STATE, NAMESPACE)
            outcome = "completed"
        except ApiException as error:
            outcome = f"failed: HTTP {error.status} {error.reason}"
        except Exception as error:
            outcome = f"failed: {job.error_line(error)}"
    states = [o for n, o in api.objects.items() if n != REPLAY]
    return Run(
        samples=samples,
        outcome=outcome,
        patched=api.sent["patch"],
        created=api.sent["create"],
        patches=api.requests["patch"],
        creates=api.requests["create"],
        stored=api.stored,
        config_maps=len(states),
        state=size_of(api.objects[STATE]),
        largest=max(size_of(o) for o in states),
        seconds=time.perf_counter() - started,
    )


@dataclass
class Counting:
    """A real CoreV1Api whose ConfigMap writes are counted: updates and the bytes of each object
    the server stored (its answer)."""

    api: Any
    updates: int = 0
    stored: int = 0
    sent: int = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.api, name)
        if not name.startswith(("patch_namespaced_config_map", "create_namespaced_config_map")):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            body = args[-1]
            self.sent += len(json.dumps(body))
            response = method(*args, **kwargs)
            self.updates += 1
            self.stored += size_of(json.loads(response.data))
            return response

        return counted


def etcd_db_size(etcd_url: str) -> int:
    """etcd's database size (bytes) from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{etcd_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    for name in ("etcd_mvcc_db_total_size_in_bytes", "etcd_debugging_mvcc_db_total_size_in_bytes"):
        for line in text.splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
    raise RuntimeError("no db size in etcd's /metrics")


def measure_cluster(samples: int, tau: float, budgets: Sequence[int] = ()) -> str:
    """Run the Job's search against a fresh real control plane; one line of what it wrote."""
    import tempfile
    from pathlib import Path

    from kubernetes import client

    from compass.api.compoundworkflow import CompoundWorkflowSpec
    from compass.commands import job
    from compass.controllers import builders, kubeapi
    from compass.controllers.ledgerchunks import chunk_name, encode, pieces, place
    from compass_dev.devcluster import Cluster, ensure_binaries

    workflow = rag_workflow(samples, tau, budgets)
    spec = CompoundWorkflowSpec.model_validate(workflow["spec"])
    with (
        tempfile.TemporaryDirectory(prefix="compass-bench-") as workdir,
        Cluster(ensure_binaries(), Path(workdir)) as cluster,
    ):
        api = client.CoreV1Api(cluster.api_client())
        namespace = {"metadata": {"name": NAMESPACE}}
        kubeapi.call(api.create_namespace, namespace)
        # The replay's ledger passes 1 MiB as text: as gzip chunks, over ConfigMaps if need be.
        text = replay_config_map(samples)["data"][builders.LEDGER_KEY]
        placed = place([encode(piece) for piece in pieces(text)])
        for index, binary in enumerate(placed):
            name = REPLAY if index == 0 else chunk_name(REPLAY, index)
            body = {"metadata": {"name": name, "namespace": NAMESPACE}, "binaryData": binary}
            kubeapi.call(api.create_namespaced_config_map, NAMESPACE, body)
        for body in builders.build_state_config_maps(workflow, spec):
            body["metadata"].pop("ownerReferences", None)  # no workflow object here
            kubeapi.call(api.create_namespaced_config_map, NAMESPACE, body)
        counting = Counting(api)
        db_before = etcd_db_size(cluster.etcd_url)
        started = time.perf_counter()
        with fake_api(counting), contextlib.redirect_stdout(io.StringIO()):  # type: ignore[arg-type]
            try:
                job.run_search(STATE, NAMESPACE)
                outcome = "completed"
            except Exception as error:
                outcome = f"failed: {job.error_line(error)}"
        seconds = time.perf_counter() - started
        db_after = etcd_db_size(cluster.etcd_url)
    return (
        f"samples={samples:>5}  {outcome} (real API server)  {counting.updates:,} ConfigMap "
        f"updates, {counting.sent:,} B sent, objects stored {counting.stored:,} B; etcd db "
        f"{db_before:,} -> {db_after:,} B (+{db_after - db_before:,}); {seconds:.1f} s"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """--samples, --tau and --budgets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="100,1000", help="dataset sizes (default 100,1000)")
    parser.add_argument("--tau", type=float, default=0.8, help="accuracy target (default 0.8)")
    parser.add_argument(
        "--budgets",
        default="",
        help="looks, e.g. 50,200,1000 (those below each size, then the size; default adaptive)",
    )
    parser.add_argument(
        "--cluster", action="store_true", help="against a real local API server and etcd"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per dataset size; exit 1 if a search failed."""
    args = parse_args(argv)
    import compass

    budgets = [int(b) for b in args.budgets.split(",") if b]
    looks = f"budgets {args.budgets}" if budgets else "adaptive looks"
    print(f"compass from {compass.__file__}, tau {args.tau}, {looks}, RAG grid replayed")
    failed = False
    for samples in (int(s) for s in args.samples.split(",")):
        if args.cluster:
            line = measure_cluster(samples, args.tau, budgets)
            failed |= " completed " not in line
            print(line, flush=True)
            continue
        run = measure(samples, args.tau, budgets)
        failed |= run.outcome != "completed"
        print(
            f"samples={run.samples:>5}  {run.outcome}  PATCHed {run.patched:>11,} B in "
            f"{run.patches} requests, created {run.created:>9,} B in {run.creates}, "
            f"total {run.patched + run.created:>11,} B; objects stored (etcd) "
            f"{run.stored:>13,} B; {run.config_maps} ConfigMap(s), the state {run.state:,} B, "
            f"largest {run.largest:,} B; {run.seconds:.1f} s"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A helper that plays the kubelet: it runs Pods' containers as local processes.

The control plane in compass.lab.devcluster has no kubelet and no scheduler, so without this a
Job's pods stay Pending forever. A Node watches Pods (all namespaces, or one, optionally with a
label selector); for each Pending pod it binds the pod to itself, runs each container's command
and args as a subprocess (environment from the container's env, a working directory per pod),
and writes the pod's status through the status subresource, as a kubelet does: Running, then
Succeeded or Failed with each container's exit code and, as the termination message, the last
lines of its output. The real job controller then counts successes and failures, retries up to
backoffLimit and marks the Job Complete or Failed.

Images do not exist here, so a container's program is its `command` as written (run from PATH,
`sh -c ...` works as is), or what a LocalImage says about its image: the image's ENTRYPOINT and
CMD, programs to substitute (e.g. the image `compass-operator`'s `compass` -> the venv's
`compass`), and extra environment. A `command_hook` may rewrite any argv last.

Not modelled: volumes (mounts are ignored), probes, resources, pod-level activeDeadlineSeconds,
the image's WORKDIR (each pod gets its own directory), `kubectl logs` (use Node.log()).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

Pod = dict[str, Any]  # a Pod as the API returns it (JSON), not the client's models
Container = dict[str, Any]
CommandHook = Callable[[Pod, Container, list[str]], list[str]]

MESSAGE_LINES = 20  # like terminationMessagePolicy FallbackToLogsOnError: the tail of the output
MESSAGE_BYTES = 2048
RESTART_DELAY_S = 1.0  # restartPolicy OnFailure/Always: the kubelet's back-off, shortened


class ContainerConfigError(Exception):
    """The container cannot be run here (no command, an env source missing); fails the pod."""


@dataclass(frozen=True)
class LocalImage:
    """How the node runs containers of one image, which does not exist on this machine."""

    entrypoint: Sequence[str] = ()  # the image's ENTRYPOINT: used when a container has no command
    cmd: Sequence[str] = ()  # the image's CMD: used when a container has neither command nor args
    executables: Mapping[str, str] = field(default_factory=dict)  # argv[0] -> local program
    env: Mapping[str, str] = field(default_factory=dict)  # the image's ENV


def image_keys(image: str) -> list[str]:
    """Names an image reference may be registered under, most specific first."""
    keys = [image]
    name = image.split("@", 1)[0]
    keys.append(name)
    if ":" in name.rsplit("/", 1)[-1]:  # a tag, not a registry's port
        name = name.rsplit(":", 1)[0]
        keys.append(name)
    keys.append(name.rsplit("/", 1)[-1])
    return list(dict.fromkeys(keys))


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values; $$ escapes."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, value)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tail(path: Path, offset: int = 0) -> str:
    """The end of what was written to path after offset (one run of a container)."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()[-MESSAGE_LINES:]
    text = "\n".join(lines)
    return text.encode()[-MESSAGE_BYTES:].decode("utf-8", errors="ignore")


@dataclass
class _Run:
    """One pod being run: its processes, so that a deletion can kill them."""

    pod: Pod
    directory: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    deleted: threading.Event = field(default_factory=threading.Event)
    # container name -> (restart count, its last terminated state), for the status
    restarts: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)


class Node:
    """Runs pods locally and reports them through the API; start() and stop(), or `with`."""

    def __init__(
        self,
        api_client: Any,
        workdir: Path,
        *,
        name: str = "compass-node",
        namespace: str | None = None,
        label_selector: str | None = None,
        images: Mapping[str, LocalImage] | None = None,
        command_hook: CommandHook | None = None,
        env: Mapping[str, str] | None = None,
        inherit_env: bool = True,
        max_pods: int = 32,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.workdir = workdir
        self.name = name
        self.namespace = namespace
        self.label_selector = label_selector
        self.images = dict(images or {})
        self.command_hook = command_hook
        self.env = dict(env or {})
        self.inherit_env = inherit_env
        self._pool = ThreadPoolExecutor(max_workers=max_pods, thread_name_prefix=f"{name}-pod")
        self._stopping = threading.Event()
        self._watching = threading.Event()
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # pod UIDs taken
        self._runs: dict[str, _Run] = {}  # pod UID -> its run, while running
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []  # what went wrong in the node itself (not in pods)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 10.0) -> Node:
        """Start watching in a thread; returns once the first list has been handled."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        if not self._watching.wait(timeout_s):
            raise RuntimeError(f"node {self.name} could not list pods: {self.errors[-1:]}")
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching, kill the processes still running (by PID) and wait for the workers."""
        self._stopping.set()
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.deleted.set()
            self._kill(run)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ queries
    def pod_dir(self, namespace: str, pod_name: str) -> Path:
        """The working directory of the newest run of a pod (its name is not unique over time)."""
        runs = sorted((self.workdir / namespace).glob(f"{pod_name}-*"), key=os.path.getmtime)
        if not runs:
            raise FileNotFoundError(f"node {self.name} never ran {namespace}/{pod_name}")
        return runs[-1]

    def log(self, namespace: str, pod_name: str, container: str | None = None) -> str:
        """What a container printed (stdout and stderr), like `kubectl logs`."""
        directory = self.pod_dir(namespace, pod_name)
        if container is None:
            logs = sorted(directory.glob("*.log"))
            if len(logs) != 1:
                raise ValueError(f"{namespace}/{pod_name}: name one of {[p.stem for p in logs]}")
            return logs[0].read_text(encoding="utf-8", errors="replace")
        return (directory / f"{container}.log").read_text(encoding="utf-8", errors="replace")

    # ------------------------------------------------------------------ watching
    def _list(self, **kwargs: Any) -> Any:
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if self.namespace:
            return self.core.list_namespaced_pod(self.namespace, _preload_content=False, **kwargs)
        return self.core.list_pod_for_all_namespaces(_preload_content=False, **kwargs)

    def _loop(self) -> None:
        resource_version: str | None = None
        while not self._stopping.is_set():
            try:
                if resource_version is None:
                    listing = json.loads(self._list().data)
                    for pod in listing["items"]:
                        self._handle(pod)
                    resource_version = listing["metadata"]["resourceVersion"]
                    self._watching.set()
                resource_version = self._watch(resource_version)
            except Exception as error:  # the loop must survive anything; it records why
                if self._stopping.is_set():
                    break
                gone = isinstance(error, ApiException) and error.status == 410
                if not gone:
                    self.errors.append(f"{type(error).__name__}: {error}")
                resource_version = None  # list again
                time.sleep(0.2)

    def _watch(self, resource_version: str) -> str | None:
        """One short watch request (stop() is prompt); the resourceVersion to go on from."""
        response = self._list(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
        try:
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        if obj.get("code") == 410:
                            return None  # too old: list again
                        raise RuntimeError(f"watch error: {obj}")
                    resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._handle(obj, deleted=event["type"] == "DELETED")
                if self._stopping.is_set():
                    break
        finally:
            response.close()
            response.release_conn()
        return resource_version

    def _handle(self, pod: Pod, deleted: bool = False) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        mine = spec.get("nodeName") in (None, "", self.name)
        if deleted or meta.get("deletionTimestamp"):
            with self._lock:
                run = self._runs.get(uid)
            if run is not None:
                run.deleted.set()
                self._kill(run)
            if not deleted and spec.get("nodeName") == self.name and not self._stopping.is_set():
                # What a kubelet does once the containers are gone: finish the graceful delete.
                self._pool.submit(self._finalize_delete, meta["namespace"], meta["name"], uid)
            return
        if not mine or pod.get("status", {}).get("phase", "Pending") != "Pending":
            return
        with self._lock:
            if uid in self._seen or self._stopping.is_set():
                return
            self._seen.add(uid)
        self._pool.submit(self._run_pod, pod)

    # ------------------------------------------------------------------ running a pod
    def _run_pod(self, pod: Pod) -> None:
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        run = _Run(pod=pod, directory=self.workdir / namespace / f"{name}-{uid[:8]}")
        run.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._runs[uid] = run
        try:
            if not pod["spec"].get("nodeName") and not self._bind(namespace, name, uid):
                return
            started = _now()
            for container in pod["spec"].get("initContainers") or []:
                result = self._run_container(run, container, restart_policy="Never")
                if result["exitCode"] != 0 or run.deleted.is_set():
                    self._finish(run, started, {}, {container["name"]: result})
                    return
            containers = pod["spec"]["containers"]
            self._report_running(run, started, {})
            results: dict[str, dict[str, Any]] = {}
            policy = pod["spec"].get("restartPolicy", "Always")
            threads = [
                threading.Thread(
                    target=lambda c=c: results.__setitem__(
                        c["name"], self._run_container(run, c, policy, started)
                    )
                )
                for c in containers
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self._finish(run, started, results, {})
        except Exception as error:
            if not run.deleted.is_set():
                self.errors.append(f"{namespace}/{name}: {type(error).__name__}: {error}")
        finally:
            with self._lock:
                self._runs.pop(uid, None)

    def _bind(self, namespace: str, name: str, uid: str) -> bool:
        """Assign the pod to this node, as a scheduler would; False if someone else has it."""
        body: Any = {  # the client accepts the JSON form of a V1Binding
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
        }
        try:
            self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        except ApiException as error:
            if error.status in (404, 409):  # gone, or bound elsewhere
                return False
            raise
        return True

    def _run_container(
        self,
        run: _Run,
        container: Container,
        restart_policy: str,
        started: str | None = None,
    ) -> dict[str, Any]:
        """Run one container to its end (restarting per policy); its terminated state."""
        name = container["name"]
        log = run.directory / f"{name}.log"
        restarts = 0
        while True:
            try:
                env = self._environment(run.pod, container)
                argv = self._argv(run.pod, container, env)
            except ContainerConfigError as error:
                log.write_text(f"{error}\n", encoding="utf-8")
                return self._terminated(container, 128, "ContainerConfigError", str(error))
            began = _now()
            with log.open("ab") as out:
                offset = out.tell()  # the log keeps every run; the message is this run's
                try:
                    process = subprocess.Popen(
                        argv,
                        cwd=run.directory,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group, killed as one
                    )
                except OSError as error:
                    out.write(f"{argv[0]}: {error}\n".encode())
                    return self._terminated(container, 127, "StartError", str(error), began)
            run.processes[name] = process
            if run.deleted.is_set():
                self._kill(run)
            code = process.wait()
            result = self._terminated(
                container, code if code >= 0 else 128 - code, None, _tail(log, offset), began
            )
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
            if not restart or run.deleted.is_set() or self._stopping.is_set():
                return result
            restarts += 1
            self._report_running(run, started or began, {name: (restarts, result)})
            if run.deleted.wait(RESTART_DELAY_S):
                return result

    def _terminated(
        self,
        container: Container,
        code: int,
        reason: str | None,
        message: str,
        started: str | None = None,
    ) -> dict[str, Any]:
        return {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "message": message,
            "startedAt": started or _now(),
            "finishedAt": _now(),
            "containerID": f"{self.name}://{container['name']}",
        }

    def _argv(self, pod: Pod, container: Container, env: Mapping[str, str]) -> list[str]:
        image = self._image(container)
        command, args = container.get("command"), container.get("args")
        if command:
            argv = [*command, *(args or [])]
        elif args is not None:
            argv = [*image.entrypoint, *args]
        else:
            argv = [*image.entrypoint, *image.cmd]
        if not argv:
            raise ContainerConfigError(
                f"container {container['name']!r}: no command, and node {self.name} knows no "
                f"entrypoint for image {container.get('image')!r} (give it a LocalImage)"
            )
        argv = [expand(a, env) for a in argv]
        argv[0] = image.executables.get(argv[0], argv[0])
        if self.command_hook is not None:
            argv = self.command_hook(pod, container, argv)
        return argv

    def _image(self, container: Container) -> LocalImage:
        for key in image_keys(container.get("image", "")):
            if key in self.images:
                return self.images[key]
        return LocalImage()

    def _environment(self, pod: Pod, container: Container) -> dict[str, str]:
        """Base environment, node env, image env, then the container's env (last wins)."""
        env = dict(os.environ) if self.inherit_env else {"PATH": os.environ.get("PATH", "")}
        env.update(self.env)
        env.update(self._image(container).env)
        env["HOSTNAME"] = pod["metadata"]["name"]
        namespace = pod["metadata"]["namespace"]
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._read("config_map", namespace, source["configMapRef"])
            elif "secretRef" in source:
                data = self._read("secret", namespace, source["secretRef"])
            else:
                raise ContainerConfigError(f"unsupported envFrom source {source}")
            env.update({prefix + k: v for k, v in data.items()})
        for variable in container.get("env") or []:
            name = variable["name"]
            if "valueFrom" not in variable:
                env[name] = expand(variable.get("value", ""), env)
                continue
            value_from = variable["valueFrom"]
            if "fieldRef" in value_from:
                env[name] = self._field(pod, value_from["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
                kind = "config_map" if "configMapKeyRef" in value_from else "secret"
                ref = value_from.get("configMapKeyRef") or value_from["secretKeyRef"]
                data = self._read(kind, namespace, ref)
                if ref["key"] in data:
                    env[name] = data[ref["key"]]
                elif not ref.get("optional"):
                    raise ContainerConfigError(f"env {name}: key {ref['key']!r} not in {ref}")
            else:
                raise ContainerConfigError(f"env {name}: unsupported valueFrom {value_from}")
        return env

    def _read(self, kind: str, namespace: str, ref: Mapping[str, Any]) -> dict[str, str]:
        """The data of a ConfigMap or Secret (decoded), {} when optional and absent."""
        read = getattr(self.core, f"read_namespaced_{kind}")
        try:
            obj = json.loads(read(ref["name"], namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status == 404 and ref.get("optional"):
                return {}
            raise ContainerConfigError(
                f"{kind} {namespace}/{ref['name']}: {error.reason}"
            ) from None
        data: dict[str, str] = dict(obj.get("data") or {})
        if kind == "secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return data

    def _field(self, pod: Pod, path: str) -> str:
        meta = pod["metadata"]
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": self.name,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }
        if path in simple:
            return str(simple[path])
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        raise ContainerConfigError(f"unsupported fieldRef {path}")

    # ------------------------------------------------------------------ status
    def _statuses(
        self,
        pod: Pod,
        states: Mapping[str, dict[str, Any]],
        restarts: Mapping[str, int],
        last: Mapping[str, dict[str, Any] | None],
        containers: Sequence[Container],
    ) -> list[dict[str, Any]]:
        statuses = []
        for container in containers:
            name = container["name"]
            state = states.get(name, {"waiting": {"reason": "PodInitializing"}})
            status: dict[str, Any] = {
                "name": name,
                "image": container.get("image", ""),
                "imageID": f"{self.name}://{container.get('image', '')}",
                "containerID": f"{self.name}://{name}",
                "ready": "running" in state,
                "started": "running" in state,
                "restartCount": restarts.get(name, 0),
                "state": state,
            }
            if last.get(name):
                status["lastState"] = {"terminated": last[name]}
            statuses.append(status)
        return statuses

    def _report_running(
        self,
        run: _Run,
        started: str,
        restarts: Mapping[str, tuple[int, dict[str, Any] | None]],
    ) -> None:
        pod = run.pod
        now = _now()
        containers = pod["spec"]["containers"]
        # Each restart reports one container; keep what was reported of the others.
        run.restarts.update(restarts)
        previous = run.restarts
        states = {c["name"]: {"running": {"startedAt": now}} for c in containers}
        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": started,
            "conditions": self._conditions(ready=True),
            "containerStatuses": self._statuses(
                pod,
                states,
                {k: v[0] for k, v in previous.items()},
                {k: v[1] for k, v in previous.items()},
                containers,
            ),
        }
        self._patch_status(run, status)

    def _finish(
        self,
        run: _Run,
        started: str,
        results: Mapping[str, dict[str, Any]],
        init_results: Mapping[str, dict[str, Any]],
    ) -> None:
        if run.deleted.is_set():
            return  # the pod is being deleted: there is no status left to write
        pod = run.pod
        every = {**init_results, **results}
        failed = any(r["exitCode"] != 0 for r in every.values()) or not results
        previous = run.restarts
        status: dict[str, Any] = {
            "phase": "Failed" if failed else "Succeeded",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": started,
            "conditions": self._conditions(ready=False),
            "containerStatuses": self._statuses(
                pod,
                {k: {"terminated": v} for k, v in results.items()},
                {k: v[0] for k, v in previous.items()},
                {k: v[1] for k, v in previous.items()},
                pod["spec"]["containers"],
            ),
        }
        if init_results:
            status["initContainerStatuses"] = self._statuses(
                pod,
                {k: {"terminated": v} for k, v in init_results.items()},
                {},
                {},
                pod["spec"].get("initContainers") or [],
            )
        if failed:
            failures = [f"{k}: exit {v['exitCode']}" for k, v in every.items() if v["exitCode"]]
            status["reason"] = "Error"
            status["message"] = "; ".join(failures) or "no container ran"
        self._patch_status(run, status)

    @staticmethod
    def _conditions(ready: bool) -> list[dict[str, str]]:
        now = _now()
        value = "True" if ready else "False"
        return [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": value, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        ]

    def _patch_status(self, run: _Run, status: dict[str, Any]) -> None:
        meta = run.pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"],
                meta["namespace"],
                {"status": status},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        except ApiException as error:
            if error.status == 404 or run.deleted.is_set():
                return  # deleted meanwhile
            raise

    # ------------------------------------------------------------------ deletion
    def _kill(self, run: _Run) -> None:
        for process in list(run.processes.values()):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)

    def _finalize_delete(self, namespace: str, name: str, uid: str) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._lock:
                running = uid in self._runs
            if not running:
                break
            time.sleep(0.05)
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                name,
                namespace,
                # With a body, the server reads the options from it, not from the query.
                body=cast(Any, {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}),
                _preload_content=False,
            )

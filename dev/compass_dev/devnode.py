"""A helper that plays the kubelet: it runs Pods' containers as local processes.

The control plane in compass_dev.devcluster has no kubelet and no scheduler. A Node watches Pods,
binds each Pending one to itself, runs its containers as subprocesses (argv and environment from
compass_dev.podenv, a working directory per pod, an address from compass_dev.podnetwork) and
writes the pod's status as a kubelet does: Running, ready as compass_dev.probes finds it, then
Succeeded or Failed with exit codes and the tail of the output as the termination message.
restartPolicy Always and OnFailure run a container again in the same pod. Not modelled: volumes,
liveness and startup probes, resources, grace periods, node heartbeats, `kubectl logs` (use
Node.log()).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
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

from compass_dev.podenv import (
    Container,
    ContainerConfigError,
    LocalImage,
    Pod,
    container_argv,
    container_environment,
    local_image,
)
from compass_dev.podnetwork import ADDRESSES, HOST_IP, POD_NETWORK, loopback_network
from compass_dev.probes import probe_until_exit

CommandHook = Callable[[Pod, Container, list[str]], list[str]]

MESSAGE_LINES = 20  # like terminationMessagePolicy FallbackToLogsOnError: the tail of the output
MESSAGE_BYTES = 2048
RESTART_DELAY_S = 1.0  # restartPolicy OnFailure/Always: the kubelet's back-off, shortened


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
    """One pod being run: its processes (so that a deletion can kill them) and its state."""

    pod: Pod
    directory: Path
    ip: str = HOST_IP
    started: str = ""  # status.startTime
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    deleted: threading.Event = field(default_factory=threading.Event)
    # Per container, what the status says: state (running, waiting or terminated), readiness,
    # restart count and the last terminated state.
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    ready: dict[str, bool] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Which run of each container its probe belongs to: a probe of a dead process reports nothing.
    generation: dict[str, int] = field(default_factory=dict)
    since: dict[str, tuple[str, str]] = field(default_factory=dict)  # condition -> (status, time)
    finished: bool = False  # the final status is written: nothing may say Running after it
    # One status write at a time, each composed from the state as it is then, so that the last
    # write is never older than the state.
    lock: threading.Lock = field(default_factory=threading.Lock)


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
        pod_network: str | None = POD_NETWORK,
        register: bool = True,
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
        self.max_pods = max_pods
        # Each pod gets its own address from here (None: every pod is 127.0.0.1, sharing ports).
        self.pod_network = loopback_network(pod_network)
        # Create the Node object, as a kubelet registers: the endpointslice controller (1.20)
        # refuses to fill a Service's slices while a pod's node does not exist.
        self.register = register
        self._registered = False  # created by this instance, so deleted by stop()
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
        if self.register:
            self._register()
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
        if self._registered:
            with contextlib.suppress(ApiException):
                self.core.delete_node(self.name, _preload_content=False)
            self._registered = False

    def _register(self) -> None:
        """Create this node's Node object (Ready, at 127.0.0.1); one that exists is kept."""
        now = _now()
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
        }
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": HOST_IP},
                    {"type": "Hostname", "address": self.name},
                ],
                "capacity": {"pods": str(self.max_pods)},
                "allocatable": {"pods": str(self.max_pods)},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": f"compass_dev.devnode {self.name} runs pods as local processes",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        }
        try:
            self.core.create_node(body, _preload_content=False)
        except ApiException as error:
            if error.status != 409:  # another Node of this name (or an earlier one) made it
                raise
            return
        self._registered = True

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

    def pid(self, namespace: str, pod_name: str, container: str | None = None) -> int | None:
        """The PID of a container's running process (None: not running), e.g. to kill it."""
        with self._lock:
            runs = [
                r
                for r in self._runs.values()
                if (r.pod["metadata"]["namespace"], r.pod["metadata"]["name"])
                == (namespace, pod_name)
            ]
        for run in runs:
            names = [c["name"] for c in run.pod["spec"]["containers"]]
            if container is None and len(names) != 1:
                raise ValueError(f"{namespace}/{pod_name}: name one of {names}")
            process = run.processes.get(container or names[0])
            if process is not None and process.poll() is None:
                return process.pid
        return None

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
            if self.pod_network is not None and not pod["spec"].get("hostNetwork"):
                run.ip = ADDRESSES.allocate(self.pod_network)
            run.started = _now()
            for container in pod["spec"].get("initContainers") or []:
                result = self._run_container(run, container, "Never", main=False)
                if result["exitCode"] != 0 or run.deleted.is_set():
                    self._finish(run, {}, {container["name"]: result})
                    return
            containers = pod["spec"]["containers"]
            for container in containers:
                # Running from here on (the processes start next); ready at once without a probe.
                run.states[container["name"]] = {"running": {"startedAt": _now()}}
                run.ready[container["name"]] = not container.get("readinessProbe")
            self._report(run)
            results: dict[str, dict[str, Any]] = {}
            policy = pod["spec"].get("restartPolicy", "Always")
            threads = [
                threading.Thread(
                    target=lambda c=c: results.__setitem__(
                        c["name"], self._run_container(run, c, policy)
                    )
                )
                for c in containers
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self._finish(run, results, {})
        except Exception as error:
            if not run.deleted.is_set():
                self.errors.append(f"{namespace}/{name}: {type(error).__name__}: {error}")
        finally:
            with self._lock:
                self._runs.pop(uid, None)
            if run.ip != HOST_IP:
                ADDRESSES.release(run.ip)

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
            # Gone, bound elsewhere, or its namespace is being deleted (the pod goes with it).
            terminating = error.status == 403 and "NamespaceTerminating" in str(error.body)
            if error.status in (404, 409) or terminating:
                return False
            raise
        return True

    def _run_container(
        self, run: _Run, container: Container, restart_policy: str, *, main: bool = True
    ) -> dict[str, Any]:
        """Run one container to its end (restarting per policy, probing it if it says so).

        Returns its terminated state. An init container (main=False) is not in the status.
        """
        name = container["name"]
        log = run.directory / f"{name}.log"
        while True:
            try:
                image = local_image(self.images, container)
                env = container_environment(
                    self.core,
                    run.pod,
                    container,
                    image=image,
                    node_env=self.env,
                    inherit_env=self.inherit_env,
                    node_name=self.name,
                    pod_ip=run.ip,
                )
                argv = container_argv(container, image, env, self.name)
                if self.command_hook is not None:
                    argv = self.command_hook(run.pod, container, argv)
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
            exited = threading.Event()
            probing = self._started(run, container, began, env, exited) if main else None
            code = process.wait()
            exited.set()
            result = self._terminated(
                container, code if code >= 0 else 128 - code, None, _tail(log, offset), began
            )
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
            if not restart or run.deleted.is_set() or self._stopping.is_set():
                return result
            if probing is not None:
                probing.join()  # no late result from this run's probe
            if main:
                self._backing_off(run, name, result)
            if run.deleted.wait(RESTART_DELAY_S):
                return result

    def _started(
        self,
        run: _Run,
        container: Container,
        began: str,
        env: Mapping[str, str],
        exited: threading.Event,
    ) -> threading.Thread | None:
        """A main container's process runs: report it (after a restart); its probe's thread."""
        name = container["name"]
        probe = container.get("readinessProbe")
        with run.lock:
            run.generation[name] = generation = run.generation.get(name, 0) + 1
            if generation > 1:  # the first run was reported with the others
                run.states[name] = {"running": {"startedAt": began}}
                run.ready[name] = not probe
        if generation > 1:
            self._report(run)
        if not probe:
            return None
        thread = threading.Thread(
            target=self._probe_loop,
            args=(run, container, probe, env, exited, generation),
            name=f"{self.name}-probe-{name}",
            daemon=True,
        )
        thread.start()
        return thread

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

    # ------------------------------------------------------------------ status
    def _statuses(self, run: _Run, containers: Sequence[Container]) -> list[dict[str, Any]]:
        """containerStatuses from the run's state of each container."""
        statuses = []
        for container in containers:
            name = container["name"]
            state = run.states.get(name, {"waiting": {"reason": "PodInitializing"}})
            status: dict[str, Any] = {
                "name": name,
                "image": container.get("image", ""),
                "imageID": f"{self.name}://{container.get('image', '')}",
                "containerID": f"{self.name}://{name}",
                "ready": "running" in state and run.ready.get(name, False),
                "started": "running" in state,
                "restartCount": run.restarts.get(name, 0),
                "state": state,
            }
            if name in run.last:
                status["lastState"] = {"terminated": run.last[name]}
            statuses.append(status)
        return statuses

    def _report(self, run: _Run) -> None:
        """Write the Running pod's status as its containers' states and readiness are now."""
        with run.lock:
            if run.finished or run.deleted.is_set():
                return  # a late probe result or restart: the pod has ended or is going
            statuses = self._statuses(run, run.pod["spec"]["containers"])
            unready = [s["name"] for s in statuses if not s["ready"]]
            status = {
                "phase": "Running",
                "hostIP": HOST_IP,
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "startTime": run.started,
                "conditions": self._conditions(run, unready),
                "containerStatuses": statuses,
            }
            self._patch_status(run, status)

    def _finish(
        self,
        run: _Run,
        results: Mapping[str, dict[str, Any]],
        init_results: Mapping[str, dict[str, Any]],
    ) -> None:
        """Write the final status: Succeeded or Failed, each container terminated."""
        if run.deleted.is_set():
            return  # the pod is being deleted: there is no status left to write
        pod = run.pod
        every = {**init_results, **results}
        failed = any(r["exitCode"] != 0 for r in every.values()) or not results
        with run.lock:
            run.finished = True
            run.states.update({k: {"terminated": v} for k, v in results.items()})
            status: dict[str, Any] = {
                "phase": "Failed" if failed else "Succeeded",
                "hostIP": HOST_IP,
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "startTime": run.started,
                "conditions": self._conditions(run, None),
                "containerStatuses": self._statuses(run, pod["spec"]["containers"]),
            }
            if init_results:
                init = _Run(pod=pod, directory=run.directory)
                init.states = {k: {"terminated": v} for k, v in init_results.items()}
                status["initContainerStatuses"] = self._statuses(
                    init, pod["spec"].get("initContainers") or []
                )
            if failed:
                failures = [f"{k}: exit {v['exitCode']}" for k, v in every.items() if v["exitCode"]]
                status["reason"] = "Error"
                status["message"] = "; ".join(failures) or "no container ran"
            self._patch_status(run, status)

    @staticmethod
    def _conditions(run: _Run, unready: Sequence[str] | None) -> list[dict[str, str]]:
        """The pod's conditions; unready: the containers not ready (None: the pod has ended).

        A condition's lastTransitionTime changes only when its status does (the deployment
        controller's minReadySeconds counts from the Ready one).
        """
        now = _now()
        ready = "True" if unready == [] else "False"
        if unready is None:
            reason, message = "PodCompleted", ""
        else:
            reason, message = "ContainersNotReady", f"containers with unready status: {unready}"

        def condition(type_: str, status: str) -> dict[str, str]:
            previous = run.since.get(type_)
            since = previous[1] if previous is not None and previous[0] == status else now
            run.since[type_] = (status, since)
            found = {"type": type_, "status": status, "lastTransitionTime": since}
            if status == "False":
                found["reason"] = reason
                if message:
                    found["message"] = message
            return found

        return [
            condition("Initialized", "True"),
            condition("Ready", ready),
            condition("ContainersReady", ready),
            condition("PodScheduled", "True"),
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

    # ------------------------------------------------------------------ readiness
    def _probe_loop(
        self,
        run: _Run,
        container: Container,
        probe: Mapping[str, Any],
        env: Mapping[str, str],
        exited: threading.Event,
        generation: int,
    ) -> None:
        """The probe's thread: report each change of readiness; failures are the node's own."""
        name = container["name"]

        def changed(error: str | None) -> None:
            if error is not None:  # one Event per run of failures, as `kubectl describe` shows
                self._event(run, name, "Unhealthy", f"Readiness probe failed: {error}")
            with run.lock:
                # Only this run's probe, and only a change: a late result is no news.
                current = run.generation.get(name) == generation and not exited.is_set()
                news = current and run.ready.get(name) != (error is None)
                if news:
                    run.ready[name] = error is None
            if news:
                self._report(run)

        try:
            probe_until_exit(
                probe,
                container,
                host=run.ip,
                cwd=run.directory,
                env=env,
                exited=exited,
                on_change=changed,
            )
        except Exception as error:
            if not run.deleted.is_set() and not self._stopping.is_set():
                meta = run.pod["metadata"]
                self.errors.append(
                    f"{meta['namespace']}/{meta['name']} readiness: {type(error).__name__}: {error}"
                )

    def _event(self, run: _Run, container: str, reason: str, message: str) -> None:
        """A Warning Event about a container, as the kubelet records one; best effort."""
        meta = run.pod["metadata"]
        now = _now()
        body: Any = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "fieldPath": f"spec.containers{{{container}}}",
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiException):  # e.g. the namespace is being deleted
            self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False)

    def _backing_off(self, run: _Run, name: str, result: dict[str, Any]) -> None:
        """A container ended and will run again after the back-off: not ready meanwhile."""
        with run.lock:
            run.restarts[name] = run.restarts.get(name, 0) + 1
            run.last[name] = result
            run.ready[name] = False
            run.states[name] = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {RESTART_DELAY_S:g}s restarting container {name}",
                }
            }
        self._report(run)

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

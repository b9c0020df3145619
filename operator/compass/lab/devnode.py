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

Networking: the Node registers its Node object (Ready, InternalIP 127.0.0.1), and each pod gets
its own loopback address from `pod_network` (127.0.2.0/24; all of 127.0.0.0/8 is loopback on
Linux, so a process binds one with no setup), kept across container restarts and freed when the
pod ends: status.podIP and status.podIPs say it, and so does the downward API's status.podIP
(`--bind $(POD_IP)`). hostNetwork pods, and every pod when pod_network is None, are 127.0.0.1.
readinessProbe (httpGet, tcpSocket, exec) decides containerStatuses[].ready and the Ready and
ContainersReady conditions, so the real endpointslice controller lists a Service's pods as
ready or not; a container without a probe is ready while it runs. restartPolicy Always and
OnFailure run a container again in the same pod (a Deployment's pod whose process dies), unready
until its new run passes the probe.

Not modelled: volumes (mounts are ignored), liveness and startup probes, resources, a grace
period on delete (the processes get SIGKILL), pod-level activeDeadlineSeconds, the image's
WORKDIR (each pod gets its own directory), ports (a process binds what it binds: nothing stops
it binding 0.0.0.0 or the node's 127.0.0.1), node heartbeats (no Lease; the nodelifecycle
controller, not run by default, would mark the node NotReady), `kubectl logs` (use Node.log()).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import ipaddress
import json
import os
import platform
import re
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
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
HOST_IP = "127.0.0.1"  # the node's address: status.hostIP, and the IP of hostNetwork pods
# Where pod IPs come from: all of 127.0.0.0/8 is loopback on Linux, so a process binds any of
# these with no setup. Not 127.0.1.x, which Debian's /etc/hosts gives the machine's hostname.
POD_NETWORK = "127.0.2.0/24"
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
# A readinessProbe's defaults, as in the Pod API.
PROBE_DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}


class ContainerConfigError(Exception):
    """The container cannot be run here (no command, an env source missing); fails the pod."""


@dataclass(frozen=True)
class LocalImage:
    """How the node runs containers of one image, which does not exist on this machine."""

    entrypoint: Sequence[str] = ()  # the image's ENTRYPOINT: used when a container has no command
    cmd: Sequence[str] = ()  # the image's CMD: used when a container has neither command nor args
    executables: Mapping[str, str] = field(default_factory=dict)  # argv[0] -> local program
    env: Mapping[str, str] = field(default_factory=dict)  # the image's ENV


class PodAddresses:
    """Pod IPs in use, so that no two pods share one: two Nodes in one process, or in two.

    Round robin through a network's host addresses, like the host-local IPAM plugin: an address
    freed by a pod is not handed out again at once, so a stale endpoint never reaches its
    successor. 127.0.0.1 (the node and the API server) is never a pod's. Other processes (a
    second test run, the lab) are kept off an address by a lock file under lock_dir, held while
    the address is in use; the kernel lets go of it when this process dies, however it dies.
    """

    def __init__(self, lock_dir: Path | None = None) -> None:
        self.lock_dir = lock_dir or Path(tempfile.gettempdir()) / "compass-devnode-addresses"
        self._lock = threading.Lock()
        self._used: dict[str, int | None] = {}  # address -> its lock file's descriptor
        self._next: dict[ipaddress.IPv4Network, int] = {}  # network -> the offset to try next

    def allocate(self, network: ipaddress.IPv4Network) -> str:
        """A free address of network, now in use; RuntimeError when every one is taken."""
        if network.prefixlen < 31:  # skip the network and broadcast addresses, as hosts() does
            first, size = 1, network.num_addresses - 2
        else:
            first, size = 0, network.num_addresses
        with self._lock:
            start = self._next.get(network, 0)
            for step in range(size):
                offset = (start + step) % size
                address = str(network.network_address + first + offset)
                if address in self._used or address == HOST_IP:
                    continue
                claimed, descriptor = self._claim(address)
                if claimed:
                    self._used[address] = descriptor
                    self._next[network] = offset + 1
                    return address
        raise RuntimeError(f"no free pod IP left in {network}")

    def release(self, address: str) -> None:
        """Give an address back (unknown ones are ignored)."""
        with self._lock:
            descriptor = self._used.pop(address, None)
        if descriptor is not None:
            os.close(descriptor)  # and with it the lock

    def _claim(self, address: str) -> tuple[bool, int | None]:
        """Whether no other process holds address, and the descriptor that now holds it."""
        try:
            self.lock_dir.mkdir(exist_ok=True)
            descriptor = os.open(self.lock_dir / address, os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError:
            return True, None  # no lock files here: this process's bookkeeping only
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)
            return False, None
        return True, descriptor


ADDRESSES = PodAddresses()  # process-wide: every Node allocates here


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """An HTTP probe takes a redirect as an answer (a success), as the kubelet does."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _http_probe(host: str, port: int, handler: Mapping[str, Any], timeout_s: float) -> str | None:
    """One httpGet probe: None on a 2xx or 3xx answer, else why not (no proxy, no TLS checks)."""
    scheme = str(handler.get("scheme") or "HTTP").lower()
    path = handler.get("path") or "/"
    url = f"{scheme}://{host}:{port}{path if path.startswith('/') else '/' + path}"
    headers = {h["name"]: h["value"] for h in handler.get("httpHeaders") or []}
    headers.setdefault("User-Agent", "kube-probe/1.20")
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),  # the pod IP is local: never through a proxy
        urllib.request.HTTPSHandler(context=insecure),
        _NoRedirect(),
    )
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout_s) as answer:
            code = int(answer.status)
    except urllib.error.HTTPError as error:
        code = error.code
        error.close()
    except (OSError, ValueError) as error:  # URLError is an OSError
        return f"Get {url}: {getattr(error, 'reason', error)}"
    return None if 200 <= code < 400 else f"HTTP probe failed with statuscode: {code}"


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
        self.pod_network = ipaddress.IPv4Network(pod_network) if pod_network else None
        if self.pod_network is not None and not self.pod_network.subnet_of(LOOPBACK):
            raise ValueError(f"pod_network {pod_network} is not loopback (127.0.0.0/8)")
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
                        "message": f"compass.lab.devnode {self.name} runs pods as local processes",
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
                env = self._environment(run, container)
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

    def _environment(self, run: _Run, container: Container) -> dict[str, str]:
        """Base environment, node env, image env, then the container's env (last wins)."""
        pod = run.pod
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
                env[name] = self._field(run, value_from["fieldRef"]["fieldPath"])
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

    def _field(self, run: _Run, path: str) -> str:
        """The downward API's fieldRef: what the pod's metadata, spec or status says."""
        pod = run.pod
        meta = pod["metadata"]
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": self.name,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": run.ip,
            "status.podIPs": run.ip,  # one address: the list is that address
            "status.hostIP": HOST_IP,
        }
        if path in simple:
            return str(simple[path])
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        raise ContainerConfigError(f"unsupported fieldRef {path}")

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
        """The probe's thread: _probe_cycle, its failures recorded as the node's own."""
        try:
            self._probe_cycle(run, container, probe, env, exited, generation)
        except Exception as error:
            if not run.deleted.is_set() and not self._stopping.is_set():
                meta = run.pod["metadata"]
                self.errors.append(
                    f"{meta['namespace']}/{meta['name']} readiness: {type(error).__name__}: {error}"
                )

    def _probe_cycle(
        self,
        run: _Run,
        container: Container,
        probe: Mapping[str, Any],
        env: Mapping[str, str],
        exited: threading.Event,
        generation: int,
    ) -> None:
        """Probe one run of a container until it exits; report each change of its readiness."""
        settings = {**PROBE_DEFAULTS, **probe}
        name = container["name"]
        successes = failures = 0
        if exited.wait(float(settings["initialDelaySeconds"])):
            return
        while not exited.is_set():
            error = self._probe(run, container, probe, env, float(settings["timeoutSeconds"]))
            if error is None:
                successes, failures = successes + 1, 0
                change = successes == int(settings["successThreshold"])
            else:
                successes, failures = 0, failures + 1
                change = failures == int(settings["failureThreshold"])
                if change:  # one Event per run of failures, as `kubectl describe` shows them
                    self._event(run, name, "Unhealthy", f"Readiness probe failed: {error}")
            if change:
                with run.lock:
                    # Only this run's probe, and only a change: a late result is no news.
                    current = run.generation.get(name) == generation and not exited.is_set()
                    news = current and run.ready.get(name) != (error is None)
                    if news:
                        run.ready[name] = error is None
                if news:
                    self._report(run)
            if exited.wait(float(settings["periodSeconds"])):
                return

    def _probe(
        self,
        run: _Run,
        container: Container,
        probe: Mapping[str, Any],
        env: Mapping[str, str],
        timeout_s: float,
    ) -> str | None:
        """Run a probe once: None when it succeeds, else why it failed."""
        if "exec" in probe:
            try:
                done = subprocess.run(
                    probe["exec"].get("command") or [],
                    cwd=run.directory,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=timeout_s,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                return str(error)
            output = (done.stdout + done.stderr).decode(errors="replace").strip()
            return None if done.returncode == 0 else f"exit {done.returncode}: {output[-200:]}"
        handler = probe.get("httpGet") or probe.get("tcpSocket")
        if handler is None:
            return f"unsupported probe {sorted(probe)}"
        host = handler.get("host") or run.ip
        try:
            port = self._port(container, handler["port"])
        except ContainerConfigError as error:
            return str(error)
        if "tcpSocket" in probe:
            try:
                socket.create_connection((host, port), timeout=timeout_s).close()
            except OSError as error:
                return f"dial tcp {host}:{port}: {error}"
            return None
        return _http_probe(host, port, handler, timeout_s)

    @staticmethod
    def _port(container: Container, port: int | str) -> int:
        """A probe's port: a number, or the name of one of the container's ports."""
        if isinstance(port, int) or port.isdigit():
            return int(port)
        for declared in container.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
        raise ContainerConfigError(f"container {container['name']!r} has no port named {port!r}")

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

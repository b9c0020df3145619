"""Local Triton and Prometheus servers on loopback, for tests, the demo and the benchmarks.

Triton comes from the `nvidia-pytriton` wheel (its `tritonserver` binary and Python backend),
Prometheus from Debian's `prometheus` package. Each server is a child process on free loopback
ports, stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import compass_rules
from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass_dev.processes import free_port as free_port  # the triton tier imports it from here
from compass_dev.processes import free_ports, stop
from compass_rules.protocol import ROLE_PARAMETER, router_file

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0


class LocalServerError(RuntimeError):
    """A local server could not be found, started or reached; the message says what to do."""


def model_images() -> Path:
    """The model-images folder: $COMPASS_MODEL_IMAGES, else the one in this checkout."""
    return Path(os.environ.get("COMPASS_MODEL_IMAGES", REPO_ROOT / "model-images"))


def _set_parameter(pbtxt: str, key: str, value: str) -> str:
    """Set (or add) a string parameter in a model config's text."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    entry = f'parameters {{ key: "{key}" value: {{ string_value: "{escaped}" }} }}'
    pattern = re.compile(
        r'parameters\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*'
        r'"(?:[^"\\]|\\.)*"\s*\}\s*\}',
        re.DOTALL,
    )
    if pattern.search(pbtxt):
        return pattern.sub(lambda _: entry, pbtxt, count=1)
    return pbtxt.rstrip("\n") + "\n" + entry + "\n"


def _set_instances(pbtxt: str, count: int) -> str:
    """Set the instance count of a model config's (single) instance group."""
    pattern = re.compile(r"(instance_group\s*\[\s*\{[^}]*?count:\s*)\d+")
    if not pattern.search(pbtxt):
        raise LocalServerError("the model config has no instance_group count to set")
    return pattern.sub(lambda match: f"{match.group(1)}{count}", pbtxt, count=1)


def assemble_repository(
    workflow: str,
    destination: Path,
    parameters: Mapping[str, Mapping[str, str]] | None = None,
    instances: Mapping[str, int] | None = None,
) -> Path:
    """Copy a workflow's model repository and fill in the shared code, as its Dockerfile does.

    ``model-images/<workflow>/models`` holds each model's config; a model without its own
    ``1/model.py`` gets the generic router code (``router`` and its control model, whose config
    names a ``compass_role``) or the workflow's ``component.py``.
    ``parameters`` sets model config parameters, e.g. {"generator": {"time_scale": "0.1"}};
    ``instances`` sets models' instance counts, e.g. {"router": 4} (requests served at once).
    """
    source = model_images() / workflow / "models"
    if not source.is_dir():
        known = sorted(p.name for p in model_images().iterdir() if (p / "models").is_dir())
        raise LocalServerError(f"workflow {workflow!r} not found; known: {', '.join(known)}")
    shutil.copytree(source, destination, dirs_exist_ok=True)
    for config in destination.glob("*/config.pbtxt"):
        model = config.parent
        version = model / "1"
        version.mkdir(exist_ok=True)
        text = config.read_text(encoding="utf-8")
        if not (version / "model.py").exists():
            # The router and its control model share the generic router code.
            if model.name == DEFAULT_ROUTER_MODEL or ROLE_PARAMETER in text:
                copy_router(version)
            else:
                shutil.copy(model_images() / workflow / "component.py", version / "model.py")
        for key, value in (parameters or {}).get(model.name, {}).items():
            text = _set_parameter(text, key, value)
        if model.name in (instances or {}):
            text = _set_instances(text, (instances or {})[model.name])
        config.write_text(text, encoding="utf-8")
    return destination


def copy_router(version: Path) -> None:
    """The generic router into a model's version folder, as the images' Dockerfiles lay it
    out: model.py, its compass_router package, and the compass_rules package it imports."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(model_images() / "router", version, ignore=skip, dirs_exist_ok=True)
    shutil.copytree(
        Path(compass_rules.__file__).parent,
        version / "compass_rules",
        ignore=skip,
        dirs_exist_ok=True,
    )


@dataclass(frozen=True)
class TritonInstallation:
    """Where the wheel's tritonserver lives and the environment it needs."""

    binary: Path
    backends: Path
    library_path: str

    @staticmethod
    def find(cache: Path | None = None) -> TritonInstallation:
        """Locate the wheel and lay out the Python backend as tritonserver expects it."""
        try:
            import pytriton
        except ImportError:
            raise LocalServerError(
                "nvidia-pytriton is not installed: pip install 'compass-operator[local]'"
            ) from None
        root = Path(pytriton.__file__).parent / "tritonserver"
        libs = Path(pytriton.__file__).parents[1] / "nvidia_pytriton.libs"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise LocalServerError(f"nvidia-pytriton has no Python backend stub for {version}")
        backends = cache or Path(tempfile.gettempdir()) / f"compass-triton-backends-{version}"
        python_backend = backends / "python"
        python_backend.mkdir(parents=True, exist_ok=True)
        # The backend library, its utils module and the stub must sit in one folder.
        for item in [*(root / "backends" / "python").glob("*.*"), stub]:
            target = python_backend / item.name
            if not target.exists() or target.stat().st_size != item.stat().st_size:
                shutil.copy2(item, target)
        library_path = os.pathsep.join([str(libs), str(sysconfig.get_config_var("LIBDIR") or "")])
        return TritonInstallation(root / "bin" / "tritonserver", backends, library_path)

    def server_command(self, repository: Path, models: Sequence[str] = ()) -> list[str]:
        """tritonserver serving ``repository`` (``models``, or all of them), without addresses
        and ports: the caller adds those (loopback ports here, a pod's IP in the k8s tier)."""
        return [
            str(self.binary),
            f"--model-repository={repository}",
            f"--backend-directory={self.backends}",
            "--disable-auto-complete-config",
            "--allow-gpu-metrics=false",
            "--model-control-mode=explicit",
            *(f"--load-model={m}" for m in models or ["*"]),
            "--metrics-interval-ms=250",
            "--log-verbose=0",
            # In-flight requests get this long at shutdown; tests and the demo stop often.
            "--exit-timeout-secs=5",
        ]

    def environment(self) -> dict[str, str]:
        """The variables tritonserver needs on top of this process's environment."""
        return {
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (self.library_path, os.environ.get("LD_LIBRARY_PATH", "")) if p
            ),
            # The Python backend runs `python` stubs from PATH: this interpreter's environment.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }


def _wait_http(
    url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    what: str,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    request = urllib.request.Request(url, headers=dict(headers or {}))
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise LocalServerError(f"{what} exited with {process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(request, timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise LocalServerError(f"{what} not ready at {url} after {STARTUP_TIMEOUT_S:.0f} s; see {log}")


@dataclass
class _Process:
    """A child server process, stopped by PID on exit."""

    process: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)

    @property
    def pid(self) -> int:
        """The child's PID."""
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        stop(self.process, 15, 5)


@dataclass
class LocalTriton(_Process):
    """A tritonserver serving one model repository on loopback (free ports unless given).

    ``models`` are the models to load (none given: all of them); ``host`` is the loopback
    address to bind, so several servers can share ports on their own addresses, as pods do.
    """

    repository: Path = field(default_factory=Path)
    models: Sequence[str] = ()
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    # More tritonserver flags (e.g. --grpc-use-ssl=true and its certificates).
    extra_args: Sequence[str] = ()

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """host:port of the HTTP endpoint."""
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """URL of Triton's Prometheus metrics."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def start(self, workdir: Path) -> LocalTriton:
        """Start the server and wait until every model is ready."""
        installation = TritonInstallation.find()
        spare = free_ports(3)
        self.http_port = self.http_port or spare[0]
        self.grpc_port = self.grpc_port or spare[1]
        self.metrics_port = self.metrics_port or spare[2]
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "tritonserver.log"
        command = [
            *installation.server_command(self.repository, self.models),
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            *self.extra_args,
        ]
        # The router's pending-count poller reads this server's metrics (not 8002's).
        env = {
            **os.environ,
            **installation.environment(),
            "COMPASS_METRICS_URL": f"http://{self.host}:{self.metrics_port}/metrics",
        }
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        _wait_http(
            f"http://{self.http_url}/v2/health/ready", self.process, self.log, "tritonserver"
        )
        return self

    def router_file(self, suffix: str, router_model: str = DEFAULT_ROUTER_MODEL) -> Path | None:
        """The file model-images/router's state.py keeps for this server's router under
        ``suffix`` (e.g. "binding.json"); None while the server is not running."""
        if self.process is None or self.process.poll() is not None:
            return None
        return Path(router_file(router_model, self.process.pid, suffix))

    def router_table(self, kind: str, router_model: str = DEFAULT_ROUTER_MODEL) -> Any:
        """The ``kind`` table ("binding" or "admission") this server's router holds, as the
        last switch sent it, or None (router_file's ``kind``.json: model-images/router/
        compass_router/state.py's BINDING_FILE and ADMISSION_FILE)."""
        path = self.router_file(f"{kind}.json", router_model)
        try:
            return None if path is None else json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # none (or replaced as it was read): none for now


def fleet_host(index: int) -> str:
    """The loopback address of a fleet's ``index``-th server (127.0.3.1, 127.0.3.2, ...): its
    own, as a pod's, so the servers share ports and none takes a single server's 127.0.0.1."""
    return f"127.0.3.{index + 1}"


@contextmanager
def local_fleet(
    workdir: Path, replicas: int, server: Callable[[Path, str], LocalTriton]
) -> Iterator[list[LocalTriton]]:
    """``replicas`` tritonservers started as a Service's pods: the k-th is ``server(workdir /
    f"pod{k}", fleet_host(k))``. All are stopped on leaving, those started before one that
    failed to start (and that one) too."""
    with ExitStack() as stack:
        servers = []
        for k in range(replicas):
            where = workdir / f"pod{k}"
            # Entered before it starts: a start that times out leaves a process to stop.
            servers.append(stack.enter_context(server(where, fleet_host(k))).start(where))
        yield servers


def prometheus_binary() -> Path:
    """Debian's prometheus binary, or a clear error naming the package."""
    found = shutil.which("prometheus")
    if found is None:
        raise LocalServerError("prometheus not found: apt-get install prometheus (Debian)")
    return Path(found)


@dataclass
class LocalPrometheus(_Process):
    """A Prometheus scraping the given targets every ``interval_s`` seconds (on ``port``, or a
    free one)."""

    targets: Sequence[str] = ()
    interval_s: float = 1.0
    port: int = 0
    # Its --web.config.file (TLS, basic auth): https when it serves TLS; the readiness check
    # then sends these headers and trusts this context.
    web_config: Path | None = None
    tls: bool = False
    ready_headers: Mapping[str, str] = field(default_factory=dict)
    ready_context: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        """Base URL of the Prometheus HTTP API."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, workdir: Path) -> LocalPrometheus:
        """Write the scrape config, start the server and wait until it is ready."""
        self.port = self.port or free_port()  # a given port: a Prometheus appearing at a URL
        self.log = workdir / "prometheus.log"
        config = workdir / "prometheus.yml"
        targets = ", ".join(f'"{t}"' for t in self.targets)
        config.write_text(
            "global:\n"
            f"  scrape_interval: {round(self.interval_s * 1000)}ms\n"
            f"  evaluation_interval: {round(self.interval_s * 1000)}ms\n"
            "scrape_configs:\n"
            "  - job_name: triton\n"
            f"    static_configs:\n      - targets: [{targets}]\n",
            encoding="utf-8",
        )
        command = [
            str(prometheus_binary()),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        if self.web_config is not None:
            command.append(f"--web.config.file={self.web_config}")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _wait_http(
            f"{self.url}/-/ready",
            self.process,
            self.log,
            "prometheus",
            self.ready_headers,
            self.ready_context,
        )
        return self

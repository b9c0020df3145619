"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-controller-manager.

Plain Python (no pytest), used by the k8s test tier, `compass demo --cluster`,
hack/k8s/start.sh and the benches: ``with Cluster(ensure_binaries(), workdir) as cluster:``.
Every process is a child on free loopback ports, logs to a file and is stopped by its PID.
There is no kubelet and no scheduler: compass_dev.devnode plays the node. `Operator` runs
`compass operator` as a child process. docs/development.md, "The local control plane".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from kubernetes import config

from compass_dev.devnode import Node
from compass_dev.processes import (
    die_with_parent,
    free_ports,
    log_tail,
    stop,
    venv_executable,
    wait_for,
)

# dev/compass_dev/devcluster.py -> the checkout (the build script is in no installed wheel).
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "k8s" / "build.sh"
# hack/k8s/build.sh's "cannot build on this machine" status (not root, no apt-get...).
CANNOT_BUILD = 3

# What the tests need by default: Jobs -> Pods, garbage collection, namespaces that get a default
# service account with a token (the ServiceAccount admission plugin rejects pods without one),
# Deployments (-> ReplicaSets -> Pods) for the operator's own manifests, and EndpointSlices
# (discovery.k8s.io/v1beta1 in 1.20) for Services whose pods the node runs on their own IPs.
DEFAULT_CONTROLLERS = (
    "job",
    "garbagecollector",
    "namespace",
    "serviceaccount",
    "serviceaccount-token",
    "deployment",
    "replicaset",
    "endpointslice",
)
ADMIN_USER = "compass-admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


class ClusterUnavailableError(Exception):
    """The control plane cannot be built or run on this machine (a reason to skip, loudly)."""


class ClusterError(RuntimeError):
    """Building or starting the control plane failed where it should have worked."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the programs a Cluster runs."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path
    etcd: Path
    openssl: Path

    @classmethod
    def in_dir(cls, bin_dir: Path) -> Binaries:
        """The Kubernetes binaries in bin_dir; etcd and openssl from PATH."""
        missing = [n for n in ("etcd", "openssl") if shutil.which(n) is None]
        if missing:
            raise ClusterUnavailableError(
                f"{' and '.join(missing)} not on PATH (Debian: apt-get install etcd-server openssl)"
            )
        found = cls(
            kube_apiserver=bin_dir / "kube-apiserver",
            kube_controller_manager=bin_dir / "kube-controller-manager",
            kubectl=bin_dir / "kubectl",
            etcd=Path(shutil.which("etcd") or "etcd"),
            openssl=Path(shutil.which("openssl") or "openssl"),
        )
        for path in (found.kube_apiserver, found.kube_controller_manager, found.kubectl):
            if not os.access(path, os.X_OK):
                raise ClusterError(f"{path} is not an executable; run {BUILD_SCRIPT}")
        return found


def ensure_binaries(*, stream: TextIO | None = None, timeout_s: float = 3600) -> Binaries:
    """Run hack/k8s/build.sh (seconds when cached; a cold build takes minutes) and find its output.

    stream receives the script's progress lines as they come (e.g. sys.stderr). Raises
    ClusterUnavailableError when the script says it cannot build here (or is not there: an
    installed package without its checkout), ClusterError when it fails.
    """
    if not BUILD_SCRIPT.is_file():
        raise ClusterUnavailableError(
            f"{BUILD_SCRIPT} not found: the control plane is built from a compass-operator checkout"
        )
    process = subprocess.Popen(
        [str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    lines: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line.rstrip("\n"))
        if stream is not None:
            stream.write(line)
            stream.flush()
    stdout = process.stdout.read() if process.stdout else ""
    rc = process.wait(timeout=timeout_s)
    if rc == CANNOT_BUILD:
        raise ClusterUnavailableError(lines[-1] if lines else f"{BUILD_SCRIPT} exited {rc}")
    if rc != 0:
        tail = "\n".join(lines[-40:])
        raise ClusterError(f"{BUILD_SCRIPT} failed (exit {rc}):\n{tail}")
    return Binaries.in_dir(Path(stdout.strip().splitlines()[-1]))


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Cluster:
    """etcd + kube-apiserver + kube-controller-manager in workdir; start() then stop()."""

    binaries: Binaries
    workdir: Path
    controllers: Sequence[str] = DEFAULT_CONTROLLERS
    extra_apiserver_flags: Sequence[str] = ()
    startup_timeout_s: float = 60.0
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    api_port: int = 0
    etcd_url: str = ""  # etcd's client URL (and its /metrics)
    startup_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per startup step
    _processes: list[_Process] = field(default_factory=list, repr=False)

    # ------------------------------------------------------------------ paths
    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig for the admin user (system:masters), context compass-test."""
        return self.workdir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's certificate."""
        return self.workdir / "pki" / "ca.crt"

    @property
    def log_dir(self) -> Path:
        """Where each process writes <name>.log."""
        return self.workdir / "logs"

    def log(self, name: str) -> Path:
        """The log file of one process: etcd, kube-apiserver or kube-controller-manager."""
        return self.log_dir / f"{name}.log"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> Cluster:
        """Start all three and wait until the API server is ready; retries on a port race."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once()
            except ClusterError as error:
                self.stop()
                if "address already in use" not in str(error) or attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> Cluster:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        pki = self._make_pki()
        self.timings["pki"] = time.monotonic() - started
        etcd_port, peer_port, self.api_port, kcm_port = free_ports(4)

        data_dir = self.workdir / "etcd"
        shutil.rmtree(data_dir, ignore_errors=True)
        etcd_url = self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=compass-test",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=compass-test={peer_url}",
                "--unsafe-no-fsync",
            ],
            # etcd 3.4 refuses to start on arm64 unless told it is fine.
            env={"ETCD_UNSUPPORTED_ARCH": "arm64"} if platform.machine() == "aarch64" else None,
        )
        self._wait(etcd, lambda: _http_ok(f"{etcd_url}/health"), "etcd /health")
        self.timings["etcd"] = time.monotonic() - started

        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                "--insecure-port=0",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                *self.extra_apiserver_flags,
            ],
        )
        self._write_kubeconfig(self.kubeconfig, self.token)
        self._wait(apiserver, self._api_ready, "kube-apiserver /readyz")
        self.timings["kube-apiserver"] = time.monotonic() - started

        kcm = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--port=0",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--controllers={','.join(self.controllers)}",
                "--profiling=false",
            ],
        )
        self._wait(
            kcm,
            lambda: _http_ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure=True),
            "kube-controller-manager /healthz",
        )
        self.timings["kube-controller-manager"] = time.monotonic() - started
        self._wait(apiserver, self._default_service_account_ready, "the default service account")
        self.startup_s = self.timings["default service account"] = time.monotonic() - started
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM each process (newest first) by PID, SIGKILL after timeout_s; idempotent."""
        for process in reversed(self._processes):
            stop(process.popen, timeout_s, timeout_s)
        self._processes.clear()

    # ------------------------------------------------------------------ clients
    def api_client(self, impersonate: str | None = None, group: str | None = None) -> Any:
        """A new kubernetes.client.ApiClient: the admin, or the admin impersonating a user.

        The API server adds system:authenticated to an impersonated user (and the
        system:serviceaccounts groups to a service account's name); group adds one more.
        """

        new_client = config.new_client_from_config  # untyped in the kubernetes package
        client = new_client(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        if impersonate is not None:
            client.set_default_header("Impersonate-User", impersonate)
        if group is not None:
            client.set_default_header("Impersonate-Group", group)
        return client

    def env(self) -> dict[str, str]:
        """Environment variables that point clients (kubectl, kopf, the CLI) at this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the matching kubectl (1.20) against this cluster."""
        result = subprocess.run(
            [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result

    def request(self, path: str, method: str = "GET", body: object = None) -> Any:
        """One admin request with the standard library (no client): the decoded JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.server}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=self._ssl_context(), timeout=10) as response:
            return json.loads(response.read() or b"null")

    # ------------------------------------------------------------------ internals
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> _Process:
        log = self.log(name)
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, **env} if env else None,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        process = _Process(name, popen, log)
        self._processes.append(process)
        return process

    def _wait(self, process: _Process, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                raise ClusterError(
                    f"{process.name} exited {process.popen.returncode} before {what}; "
                    f"last lines of {process.log}:\n{log_tail(process.log)}"
                )
            if ready():
                return
            time.sleep(0.1)
        raise ClusterError(
            f"{what} not ready after {self.startup_timeout_s:.0f} s; "
            f"last lines of {process.log}:\n{log_tail(process.log)}"
        )

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _api_ready(self) -> bool:
        return _http_ok(f"{self.server}/readyz", token=self.token, context=self._ssl_context())

    def _default_service_account_ready(self) -> bool:
        """The 'default' namespace's service account has its token (pods can be admitted)."""
        try:
            account = self.request("/api/v1/namespaces/default/serviceaccounts/default")
        except (urllib.error.URLError, OSError):
            return False
        return bool(account.get("secrets"))

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(
            [str(self.binaries.openssl), *args],
            cwd=self.workdir / "pki",
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(f"openssl {' '.join(args)} failed:\n{result.stderr}")

    def _make_pki(self) -> Path:
        """A CA, a serving certificate for 127.0.0.1 signed by it, and a service-account key."""
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        if (pki / "sa.pub").exists():
            return pki
        self._openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=compass-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        (pki / "apiserver.ext").write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid\n"
            "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        )
        self._openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
            "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver",
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "7", "-out", "apiserver.crt", "-extfile", "apiserver.ext",
        )  # fmt: skip
        self._openssl("genrsa", "-out", "sa.key", "2048")
        self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        return pki

    def _write_kubeconfig(self, path: Path, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "compass-test",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "compass-test",
                    "context": {"cluster": "compass-test", "user": ADMIN_USER},
                }
            ],
            "current-context": "compass-test",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def _http_ok(
    url: str,
    *,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
    insecure: bool = False,
) -> bool:
    """Whether GET url answers 200 within a second."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), context=context, timeout=1
        ) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


OPERATOR_START_S = 60.0


@dataclass
class Operator:
    """`compass operator` as a child process watching one namespace (``args`` are added to its
    command line, e.g. ("--peering", "name"))."""

    cluster: Cluster
    namespace: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    args: tuple[str, ...] = ()
    verbose: bool = True  # debug logs (the tests read them); off as in production (benchmarks)

    @property
    def pid(self) -> int:
        """The operator's PID (once started)."""
        assert self.process is not None
        return self.process.pid

    def start(self) -> Operator:
        """Start it and wait for its liveness endpoint."""
        self.metrics_port, self.health_port = free_ports(2)
        env = {
            **os.environ,
            **self.cluster.env(),
            # Everything of a local cluster listens on loopback, which no in-cluster Service
            # name reaches: allow it, as an operator run outside a cluster must.
            "COMPASS_ALLOWED_HOSTS": '["127.0.0.1", "localhost"]',
            **self.env,
            "COMPASS_METRICS_PORT": str(self.metrics_port),
            "COMPASS_HEALTH_PORT": str(self.health_port),
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    venv_executable("compass"),
                    "operator",
                    *(["--verbose"] if self.verbose else []),
                    "--namespace",
                    self.namespace,
                    *self.args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        wait_for(self._alive, OPERATOR_START_S, f"the operator's /healthz\n{self.tail()}", 0.2)
        return self

    def _alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise ClusterError(f"the operator exited {self.process.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it does not stop in time."""
        stop(self.process, 20, 5)

    def kill(self) -> None:
        """SIGKILL: no clean exit (a node lost, an OOM kill), so nothing is handed over."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()
        self.process.wait(timeout=10)

    def metrics(self) -> str:
        """The operator's own /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        return log_tail(self.log, lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Start a control plane (and a node) by hand, print how to reach it, stop on Ctrl-C."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="default: a new temporary directory")
    parser.add_argument("--no-node", action="store_true", help="do not run pods locally")
    args = parser.parse_args(argv)
    # Absolute: the control plane's processes run in the work directory, not in this one.
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="compass-k8s-"))).resolve()
    try:
        binaries = ensure_binaries(stream=sys.stderr)
    except ClusterUnavailableError as error:
        print(error, file=sys.stderr)
        return CANNOT_BUILD
    with Cluster(binaries, workdir) as cluster, contextlib.ExitStack() as stack:
        if not args.no_node:
            stack.enter_context(Node(cluster.api_client(), workdir / "node"))
        version = cluster.request("/version")["gitVersion"]
        # Before saying Ctrl-C stops it: a SIGTERM from then on must unwind through the stack.
        signal.signal(signal.SIGTERM, _interrupt)
        with contextlib.suppress(KeyboardInterrupt):
            print(
                f"Kubernetes {version} ready in {cluster.startup_s:.1f} s; logs in "
                f"{cluster.log_dir}\n"
                f"  export KUBECONFIG={cluster.kubeconfig}\n"
                f"  alias kubectl={binaries.kubectl}\n"
                "Ctrl-C stops it.",
                flush=True,
            )
            while True:
                time.sleep(3600)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

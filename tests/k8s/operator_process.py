"""`compass operator` as a child process against the test cluster: start, health, metrics, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cluster import Cluster, free_port, log_tail, wait_for
from node import venv_executable

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

    def start(self) -> Operator:
        """Start it and wait for its liveness endpoint."""
        self.metrics_port, self.health_port = free_port(), free_port()
        env = {
            **os.environ,
            **self.cluster.env(),
            **self.env,
            "COMPASS_METRICS_PORT": str(self.metrics_port),
            "COMPASS_HEALTH_PORT": str(self.health_port),
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    venv_executable("compass"),
                    "operator",
                    "--verbose",
                    "--namespace",
                    self.namespace,
                    *self.args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        wait_for(self._alive, OPERATOR_START_S, f"the operator's /healthz\n{self.tail()}", 0.2)
        return self

    def _alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the operator exited {self.process.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it does not stop in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

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

    def tail(self) -> str:
        """The end of its log."""
        return log_tail(self.log, 40)

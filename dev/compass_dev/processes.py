"""Child processes on loopback, as the development tools run them: ports, waiting, logs,
stopping by PID.

Shared by the control plane (devcluster), the node helper (devnode) and the local servers
(local_triton), none of which imports another for these; and a loopback HTTP server in a thread
for the tests' stand-ins of a metrics endpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now: each probe
    stays bound until all are chosen (one at a time, the kernel can hand the same port twice,
    and a server told to listen on one port twice fails to start)."""
    with contextlib.ExitStack() as probes:
        ports = []
        for _ in range(count):
            probe = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            probe.bind(("127.0.0.1", 0))
            ports.append(int(probe.getsockname()[1]))
        return ports


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (the tests' output stays theirs)."""

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free 127.0.0.1 port from a thread; gives host:port; stopped on
    exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait_for(
    condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1
) -> Any:
    """Poll condition() until it returns something truthy, and return that (TimeoutError: what)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent thread dies (a killed test run)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def venv_executable(name: str) -> str:
    """A program installed in the running interpreter's environment (e.g. .venv/bin/compass)."""
    return str(Path(sys.executable).parent / name)


def stop(process: subprocess.Popen[bytes] | None, grace_s: float, kill_wait_s: float) -> None:
    """SIGTERM a child that still runs; SIGKILL it if it has not exited after ``grace_s``."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=kill_wait_s)

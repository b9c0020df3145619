"""Readiness probes for the node helper (compass_dev.devnode): httpGet, tcpSocket and exec.

probe_once runs a probe one time; probe_until_exit runs it on its schedule (initial delay,
period, success and failure thresholds) for one run of a container and says when the result
changes. What a change means (readiness, the pod's status, an Event) is the node's business.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compass_dev.podenv import Container, ContainerConfigError

# A readinessProbe's defaults, as in the Pod API.
PROBE_DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}


def probe_until_exit(
    probe: Mapping[str, Any],
    container: Container,
    *,
    host: str,
    cwd: Path,
    env: Mapping[str, str],
    exited: threading.Event,
    on_change: Callable[[str | None], None],
) -> None:
    """Probe one run of a container until it exits; on_change(None or why) at each threshold.

    on_change is called when successThreshold successes, or failureThreshold failures, have
    come in a row: once per such streak, with None (success) or the last failure's reason.
    """
    settings = {**PROBE_DEFAULTS, **probe}
    timeout_s = float(settings["timeoutSeconds"])
    successes = failures = 0
    if exited.wait(float(settings["initialDelaySeconds"])):
        return
    while not exited.is_set():
        error = probe_once(probe, container, host=host, cwd=cwd, env=env, timeout_s=timeout_s)
        if error is None:
            successes, failures = successes + 1, 0
            change = successes == int(settings["successThreshold"])
        else:
            successes, failures = 0, failures + 1
            change = failures == int(settings["failureThreshold"])
        if change:
            on_change(error)
        if exited.wait(float(settings["periodSeconds"])):
            return


def probe_once(
    probe: Mapping[str, Any],
    container: Container,
    *,
    host: str,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
) -> str | None:
    """Run a probe once: None when it succeeds, else why it failed.

    host is the pod's IP (an httpGet or tcpSocket handler's own host wins); an exec probe runs
    in cwd with env, the container's working directory and environment.
    """
    if "exec" in probe:
        try:
            done = subprocess.run(
                probe["exec"].get("command") or [],
                cwd=cwd,
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
    host = handler.get("host") or host
    try:
        port = _container_port(container, handler["port"])
    except ContainerConfigError as error:
        return str(error)
    if "tcpSocket" in probe:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as error:
            return f"dial tcp {host}:{port}: {error}"
        return None
    return _http_probe(host, port, handler, timeout_s)


def _container_port(container: Container, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or port.isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ContainerConfigError(f"container {container['name']!r} has no port named {port!r}")


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

"""The metrics sources' HTTP GET: a deadline on the whole exchange, bounded answers, no redirects,
and errors in a fixed vocabulary (a server's own words go to the log only, never a status)."""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import logging
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, cast

from compass.api.urls import url_problem
from compass.dataplane.httpauth import HttpAuth

# The metrics sources' logger: what the server said is logged where the sources log.
LOG = logging.getLogger("compass.dataplane.metrics")


class MetricsUnavailableError(RuntimeError):
    """The queue depth could not be read; the message names the source and the cause."""


# A larger metrics page is refused (Triton's is tens of kB): an endless one must not fill memory.
MAX_METRICS_BYTES = 8 * 1024 * 1024
# What the log may keep of an answer (printable ASCII); no error message carries any of it.
EXCERPT_CHARS = 200
# Local socket, resolver and TLS failures, named in a fixed vocabulary (first match wins).
_CONNECTION_FAILURES = (
    ("Hostname mismatch", "TLS: the server's certificate is not for this host"),
    ("IP address mismatch", "TLS: the server's certificate is not for this address"),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "TLS: the server's certificate is not signed by a trusted CA; give its CA "
        "(metrics.authentication.tls.caKey)",
    ),
    ("WRONG_VERSION_NUMBER", "TLS handshake failed (is it an http:// endpoint?)"),
    ("SSL", "TLS handshake failed"),
    ("Name or service not known", "name not resolved"),
    ("NameResolution", "name not resolved"),
    ("nodename nor servname", "name not resolved"),
    ("Connection refused", "connection refused"),
    ("timed out", "timed out"),
    ("Network is unreachable", "network unreachable"),
)


def excerpt(data: bytes | str) -> str:
    """A short excerpt of what a server answered, safe for a log line."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    shown = "".join(c if " " <= c <= "~" else "?" for c in text[:EXCERPT_CHARS])
    return shown + ("..." if len(text) > EXCERPT_CHARS else "")


def connection_failure(error: BaseException) -> str:
    """Why a connection failed, in a fixed vocabulary (never a server's words)."""
    reason = getattr(error, "reason", None)  # a URLError wraps the socket's or ssl's error
    text = f"{error} {reason!r}" if isinstance(reason, BaseException) else str(error)
    return next((why for needle, why in _CONNECTION_FAILURES if needle in text), "cannot connect")


def checked_url(url: str) -> str:
    """The URL if it is http(s)://host[:port][/path], else ValueError (as the API checks)."""
    problem = url_problem(url)
    if problem is not None:
        raise ValueError(f"metrics URL {problem}")
    return url


class _Deadline:
    """One request's deadline for the whole of it (a socket timeout bounds each read alone: a byte
    a second would hold a thread for ever); at it the watchdog shuts the sockets down."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._done = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left (a little at least, so a connect gets a positive timeout)."""
        return max(self.at - time.monotonic(), 0.001)

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down at the deadline (a duplicate: a TLS wrapper detaches the original)."""
        copy = sock.dup()
        with self._lock:
            if not self._done and not self.expired:
                self._sockets.append(copy)
                return
        _shut(copy)

    def expire(self) -> None:
        """The deadline passed: stop every read of the request (nothing once finished)."""
        with self._lock:
            if self._done:
                return
            self.expired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def finish(self) -> None:
        """The request is over: the watchdog leaves its sockets alone."""
        with self._lock:
            self._done = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    @property
    def done(self) -> bool:
        """Whether the request is over (finished or expired)."""
        return self._done or self.expired


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class _Watchdog:
    """One thread for every deadline in the process: expires each when due."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: _Deadline) -> None:
        """Expire ``deadline`` when it passes (unless it is finished first)."""
        with self._wake:
            heapq.heappush(self._due, (deadline.at, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="compass-http-deadlines", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    if self._due and self._due[0][2].done:
                        heapq.heappop(self._due)
                        continue
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._wake.wait(wait)
                _, _, deadline = heapq.heappop(self._due)
            deadline.expire()


_WATCHDOG = _Watchdog()


class _DeadlineRequest(urllib.request.Request):
    """A GET that carries its deadline to the connection that serves it."""

    def __init__(self, url: str, headers: dict[str, str], deadline: _Deadline) -> None:
        super().__init__(url, headers=headers)
        self.deadline = deadline


def _watched_connection(
    base: type[http.client.HTTPConnection], req: urllib.request.Request
) -> Callable[..., http.client.HTTPConnection]:
    """``base`` whose socket the deadline watches from its connect (TLS handshake included)."""
    deadline = cast(_DeadlineRequest, req).deadline  # Http.get sends no other request

    def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        made = base(host, **kwargs)
        create = made._create_connection  # type: ignore[attr-defined]  # http.client's hook

        def connect(address: Any, timeout: Any = None, source: Any = None) -> socket.socket:
            limit = deadline.remaining() if timeout is None else min(timeout, deadline.remaining())
            sock: socket.socket = create(address, limit, source)
            deadline.watch(sock)
            return sock

        made._create_connection = connect  # type: ignore[attr-defined]
        return made

    return connection


class _HTTPHandler(urllib.request.HTTPHandler):
    """http:// under the request's deadline."""

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched_connection(http.client.HTTPConnection, req), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    """https:// under the request's deadline, verified against ``context``."""

    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self.tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        https = _watched_connection(http.client.HTTPSConnection, req)
        return self.do_open(https, req, context=self.tls)


def _http_opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener for http(s) only, following no redirect (no credential goes to a host it names)."""
    opener = urllib.request.OpenerDirector()
    # No redirect handler: a 3xx is an HTTPError (following it would reach a host nobody checked).
    for handler in (
        urllib.request.ProxyHandler(),
        _HTTPHandler(),
        _HTTPSHandler(context),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


_OPENER = _http_opener()


def _http_status(code: int, authenticated: bool = False) -> str:
    """An HTTP error status as the conditions show it."""
    if 300 <= code < 400:
        return f"HTTP {code}: redirects are not followed; give the final URL"
    if code in (401, 403):
        return (
            f"HTTP {code}: the credentials were refused; check the Secret's values "
            "(metrics.authentication)"
            if authenticated
            else f"HTTP {code}: the endpoint requires authentication; set metrics.authentication"
        )
    return f"HTTP {code}"


class Http:
    """GETs with one source's headers and TLS trust."""

    def __init__(self, auth: HttpAuth | None) -> None:
        self.auth = auth
        self.headers = {} if auth is None else auth.request_headers()
        self.opener = _OPENER if auth is None else _http_opener(auth.ssl_context)
        # Credentials sent: a header from the Secret, or a client certificate (mutual TLS).
        self.authenticated = "Authorization" in self.headers or (
            auth is not None and auth.client_cert_pem is not None
        )
        # The last answer was 401 or 403: the caller reads the Secret again.
        self.rejected = False

    def get(self, url: str, timeout_s: float, where: str) -> bytes:
        """The body of a 200 within ``timeout_s``, all told; MetricsUnavailableError otherwise."""
        deadline = _Deadline(timeout_s)
        request = _DeadlineRequest(url, self.headers, deadline)
        _WATCHDOG.watch(deadline)
        try:
            with self.opener.open(request, timeout=timeout_s) as response:
                data: bytes = response.read(MAX_METRICS_BYTES + 1)
        except urllib.error.HTTPError as error:
            self.rejected = error.code in (401, 403)
            # The status line's reason and the body are the server's words: the log only.
            LOG.warning("%s answered HTTP %s: %s", where, error.code, excerpt(error.msg))
            why = _http_status(error.code, self.authenticated)
            raise MetricsUnavailableError(f"{where}: {why}") from error
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            if deadline.expired:
                raise self._late(where, timeout_s) from error
            why = (
                "the answer was cut short"
                if isinstance(error, http.client.HTTPException)
                else connection_failure(error)
            )
            raise MetricsUnavailableError(f"{where}: {why}") from error
        finally:
            deadline.finish()
        if deadline.expired:  # an answer without a length ends at the shutdown: cut short
            raise self._late(where, timeout_s)
        self.rejected = False
        if len(data) > MAX_METRICS_BYTES:
            raise MetricsUnavailableError(
                f"{where}: the answer is larger than {MAX_METRICS_BYTES} bytes"
            )
        return data

    @staticmethod
    def _late(where: str, timeout_s: float) -> MetricsUnavailableError:
        LOG.warning("%s: no whole answer within %g s: the connection is closed", where, timeout_s)
        return MetricsUnavailableError(
            f"{where}: timed out: no whole answer within {timeout_s:g} s"
        )

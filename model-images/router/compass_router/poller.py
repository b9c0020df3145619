"""Triton's pending count in front of the router, polled once a pod (docs/serving.md)."""

import fcntl
import http.client
import os
import threading
import time
import urllib.request

from compass_rules.protocol import PENDING_METRIC

METRICS_URL_PARAMETER = "compass_metrics_url"
METRICS_URL_ENV = "COMPASS_METRICS_URL"
DEFAULT_METRICS_URL = "http://127.0.0.1:8002/metrics"
POLL_MS_PARAMETER = "compass_pending_poll_ms"
DEFAULT_POLL_MS = 25.0
# A count older than this many poll periods is not used (the poller is failing or stalled).
STALE_POLLS = 4
# After a failed poll (the metrics port absent or down) the poller waits this long.
POLL_RETRY_S = 1.0
# Idle for IDLE_AFTER_S, the poller looks only every IDLE_POLL_S, not 40 times a second.
IDLE_AFTER_S = 5.0
IDLE_POLL_S = 1.0
# An instance whose pod has a poller tries this often to become it (the poller gone).
LEADER_RETRY_S = 1.0


def parse_pending(text, model):
    """Triton's queue for ``model`` (all versions) in a metrics page; None: no such sample."""
    label = f'model="{model}"'
    found = None
    for line in text.splitlines():
        if not line.startswith(PENDING_METRIC + "{"):
            continue
        labels, _, value = line[len(PENDING_METRIC) + 1 :].partition("}")
        if label not in labels.split(","):
            continue
        try:
            count = float(value.split()[0])
        except (IndexError, ValueError):
            continue
        found = (found or 0) + int(count)
    return found


class PendingPoller:
    """Polls the pending count every ``period_s``; ``followers``: that less the take-ups since.

    One poller a pod (the holder of the flock ``lock_path``), writing to ``board``: eight polling
    40 times a second slowed the pod they watched (bench/serving_triton.py, 2 cores)."""

    def __init__(self, url, model, period_s, taken, board, lock_path=None):
        self.url, self.model, self.period_s, self.taken = url, model, period_s, taken
        self.board, self.lock_path = board, lock_path
        self.thread = threading.Thread(target=self._run, name="compass-pending", daemon=True)
        self.thread.start()

    def poll(self):
        """One poll: the count, or None where the page cannot be read or lacks it."""
        taken = self.taken()
        polled = time.monotonic_ns()
        try:
            with urllib.request.urlopen(self.url, timeout=max(self.period_s * 4, 0.1)) as page:
                count = parse_pending(page.read().decode("utf-8", "replace"), self.model)
        except (OSError, ValueError, http.client.HTTPException):
            count = None
        self.board.publish_poll(polled, count, taken)
        return count

    def _lead(self):
        """Wait until this process holds the pod's poller lock (kept until it exits)."""
        if self.lock_path is None:
            return
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(LEADER_RETRY_S)

    def _run(self):
        self._lead()
        seen, busy_at = self.taken(), time.monotonic()
        while True:
            started = time.monotonic()
            wait = self.period_s if self.poll() is not None else POLL_RETRY_S
            if self.taken() != seen:
                seen, busy_at = self.taken(), started
            elif started - busy_at > IDLE_AFTER_S:
                wait = max(wait, IDLE_POLL_S)
            time.sleep(max(wait - (time.monotonic() - started), 0.001))

    def followers(self):
        """Requests waiting behind the one being taken up now (0 without a fresh count)."""
        last = self.board.last_poll()
        if last is None or time.monotonic_ns() - last[0] > STALE_POLLS * self.period_s * 1e9:
            return 0
        _, count, taken = last
        return max(count - (self.taken() - taken), 0)

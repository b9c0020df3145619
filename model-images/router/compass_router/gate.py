"""The router instances' shared table, a file in memory (docs/serving.md, "The router")."""

import contextlib
import fcntl
import mmap
import os
import struct
import time

import numpy as np

from compass_rules.binding import RATE_WINDOW_S
from compass_rules.followers import static_schedule

# One slot per router instance (pid, stage, entered ns, predicted ms).
INFLIGHT_SLOTS = 64
_SLOT = struct.Struct("<qqqd")
# After the slots: a ring of the last take-ups' arrival times (ns), for the pod's arrival rate.
DISPATCH_RING = 1024
_RING_AT = INFLIGHT_SLOTS * _SLOT.size
# After the ring: the gate: the last ticket given, a count of the moves that may let a waiter pass
# (a request left, a dead one cleared), then a row per slot (Inflight.gate_slots).
_GATE_AT = _RING_AT + (DISPATCH_RING + 1) * 8
_GATE_FIELDS = 5
GATE_FREE, GATE_WAITING, GATE_RUNNING = 0, 1, 2
# After the gate: the pod's last poll of Triton's pending count: when (monotonic ns, the host's;
# 0: none or failed), the count, and the take-ups counted by then.
_POLL_AT = _GATE_AT + (2 + INFLIGHT_SLOTS * _GATE_FIELDS) * 8
_POLL_FIELDS = 3
# After the poll: when static fastest next frees a server (ns; 0: never yet), for the lag cap.
_STATIC_AT = _POLL_AT + _POLL_FIELDS * 8

# How often a request at the gate looks again when next in line, and checks for gone ones ahead.
GATE_POLL_S = 0.0005
GATE_FAR_POLLS = 10
GATE_CHECK_S = 0.05


def _alive(pid):
    """Whether process ``pid`` exists (a zombie counts as gone: it serves nothing)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Inflight:
    """Per instance its request's stage, since when and predicted time (torn reads: harmless)."""

    def __init__(self, path):
        size = _STATIC_AT + 8
        # Kept open: the gate's tickets are given under its lock.
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.fstat(self.fd).st_size < size:
                os.ftruncate(self.fd, size)
            self.table = table = mmap.mmap(self.fd, size)
            self.ring = np.frombuffer(table, np.int64, DISPATCH_RING + 1, _RING_AT)
            self.gate = np.frombuffer(table, np.int64, 2 + INFLIGHT_SLOTS * _GATE_FIELDS, _GATE_AT)
            # Per slot: pid, ticket, state, deadline ns, queued ns (one row each).
            self.gate_slots = self.gate[2:].reshape(INFLIGHT_SLOTS, _GATE_FIELDS)
            self.polled = np.frombuffer(table, np.int64, _POLL_FIELDS, _POLL_AT)
            self.static_free = np.frombuffer(table, np.int64, 1, _STATIC_AT)
            self.slot = self._claim()

    @contextlib.contextmanager
    def _locked(self):
        """The table's file lock, held by one process at a time."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def dispatched(self, arrived_ns=None):
        """Count a take-up; the pod's rate up to its arrival (``arrived_ns``; None: now), per s."""
        arrived = time.time_ns() if arrived_ns is None else int(arrived_ns)
        index = int(self.ring[0])
        self.ring[1 + index % DISPATCH_RING] = arrived
        self.ring[0] = index + 1
        stamps = self.ring[1:]
        recent = np.count_nonzero(
            (stamps > arrived - int(RATE_WINDOW_S * 1e9)) & (stamps <= arrived)
        )
        return recent / RATE_WINDOW_S

    def taken(self):
        """How many requests the pod's router instances have taken up so far."""
        return int(self.ring[0])

    def publish_poll(self, polled_ns, count, taken):
        """The pod's poll: ``count`` (None: failed) at ``polled_ns``, ``taken`` take-ups by then."""
        self.polled[1], self.polled[2] = count or 0, taken
        # Written last: a reader that sees the new time sees the count beside it.
        self.polled[0] = 0 if count is None else polled_ns

    def last_poll(self):
        """(polled at, monotonic ns; count; take-ups by then) of the pod's last poll, or None."""
        polled_ns, count, taken = (int(v) for v in self.polled)
        return None if polled_ns == 0 else (polled_ns, count, taken)

    def _claim(self):
        """This instance's slot: its own, a free one, or one of a process that is gone."""
        pid = os.getpid()
        free = None
        for slot in range(INFLIGHT_SLOTS):
            owner = _SLOT.unpack_from(self.table, slot * _SLOT.size)[0]
            if owner == pid:
                return slot
            if free is None and (owner == 0 or not os.path.exists(f"/proc/{owner}")):
                free = slot
        if free is None:
            raise ValueError(f"binding: more than {INFLIGHT_SLOTS} router instances")
        _SLOT.pack_into(self.table, free * _SLOT.size, pid, -1, 0, 0.0)
        # A gone process's place at the gate goes with its slot.
        self.gate_slots[free] = (pid, 0, GATE_FREE, 0, 0)
        self.gate[1] += 1
        return free

    def _schedule(self, arrived_ns, fastest_ns, servers):
        """Static fastest's start (ns) of a request that arrived at ``arrived_ns`` (locked)."""
        start, self.static_free[0] = static_schedule(
            int(arrived_ns), int(self.static_free[0]), int(fastest_ns / servers)
        )
        return start

    def static_start(self, arrived_ns, fastest_ns, servers):
        """When static fastest would start a request that arrived at ``arrived_ns`` (lag cap)."""
        with self._locked():
            return self._schedule(arrived_ns, fastest_ns, servers)

    def queue_at_gate(self, deadline_ns=None, schedule=None):
        """Queue at the gate in arrival order: (ticket, static fastest start or None)."""
        entry = self.gate_slots[self.slot]
        with self._locked():
            start = None if schedule is None else self._schedule(*schedule)
            ticket = int(self.gate[0]) + 1
            self.gate[0] = ticket
            entry[0], entry[1], entry[3] = os.getpid(), ticket, int(deadline_ns or 0)
            entry[4] = time.time_ns()
            # The state last: a reader that sees it waiting sees its ticket.
            entry[2] = GATE_WAITING
        return ticket, start

    def ahead_at_gate(self):
        """The slots ahead at the gate: in the pipeline, or waiting with an earlier ticket."""
        rows = self.gate_slots
        states = rows[:, 2]
        ahead = (states == GATE_RUNNING) | (
            (states == GATE_WAITING) & (rows[:, 1] < rows[self.slot, 1])
        )
        ahead[self.slot] = False
        return np.flatnonzero(ahead)

    def enter_if_free(self, slots, ahead=None):
        """Enter the pipeline if fewer than ``slots`` are ahead; whether it did."""
        if len(self.ahead_at_gate() if ahead is None else ahead) < slots:
            self.gate_slots[self.slot, 2] = GATE_RUNNING
            return True
        return False

    def pass_gate(self, slots, check_s=GATE_CHECK_S):
        """Wait until fewer than ``slots`` are ahead, then enter the pipeline; the gone ahead are
        cleared every ``check_s``, so a stub killed mid-request never wedges the gate."""
        checked = time.monotonic()
        seen = None
        while True:
            moves = int(self.gate[1])
            if moves != seen:
                seen = moves
                ahead = self.ahead_at_gate()
                if self.enter_if_free(slots, ahead):
                    return
                wait = GATE_POLL_S if len(ahead) == slots else GATE_POLL_S * GATE_FAR_POLLS
            if time.monotonic() - checked >= check_s:
                self.clear_gone(ahead)
                checked, seen = time.monotonic(), None
            time.sleep(wait)

    def clear_gone(self, slots):
        """Free the gate places among ``slots`` whose process is gone."""
        for slot in slots:
            pid = int(self.gate_slots[slot, 0])
            if _alive(pid):
                continue
            with self._locked():
                # Unless its slot was claimed again meanwhile (then it is someone else's).
                if int(self.gate_slots[slot, 0]) == pid:
                    self.gate_slots[slot, 2] = GATE_FREE
                    self.gate[1] += 1

    def pipelines_running(self):
        """How many requests are in the pipeline now, this instance's included once it entered."""
        return int(np.count_nonzero(self.gate_slots[:, 2] == GATE_RUNNING))

    def gate_followers(self):
        """(deadline or 0, queued) ns of each request waiting behind this one, in arrival order."""
        rows = self.gate_slots
        behind = (rows[:, 2] == GATE_WAITING) & (rows[:, 1] > rows[self.slot, 1])
        behind[self.slot] = False
        waiting = rows[behind]
        ordered = waiting[np.argsort(waiting[:, 1])]
        return [(int(d), int(q)) for d, q in ordered[:, 3:5].tolist()]

    def leave_gate(self):
        """This instance's request left the pipeline (served, failed or refused)."""
        with self._locked():
            self.gate_slots[self.slot, 2] = GATE_FREE
            # Counted under the lock: a lost count could leave a waiter asleep past its turn.
            self.gate[1] += 1

    def enter(self, stage, predicted_ms):
        """This instance's request is now at ``stage`` (queued or served there)."""
        _SLOT.pack_into(
            self.table,
            self.slot * _SLOT.size,
            os.getpid(),
            stage,
            time.monotonic_ns(),
            predicted_ms,
        )

    def leave(self):
        """This instance's request is at no component."""
        _SLOT.pack_into(self.table, self.slot * _SLOT.size, os.getpid(), -1, 0, 0.0)

    def backlog_ms(self, stages):
        """The predicted work still ahead at each component from the other instances' requests."""
        now = time.monotonic_ns()
        backlog = [0.0] * stages
        for slot in range(INFLIGHT_SLOTS):
            if slot == self.slot:
                continue
            owner, stage, entered, predicted = _SLOT.unpack_from(self.table, slot * _SLOT.size)
            if owner and 0 <= stage < stages:
                backlog[stage] += max(predicted - (now - entered) / 1e6, 0.0)
        return backlog

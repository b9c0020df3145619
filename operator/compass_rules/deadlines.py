"""A client's deadline (the request parameter compass_deadline_ns) as the routers count on it:
parsed once, never past what int64 holds, clamped to a few SLOs after its take-up, and at the
gate counted as an ordinary request's deadline by the requests ahead (docs/serving.md, "The
router").

One client's deadline feeds what the routers share: the gate's table (the slack of the requests
waiting behind another, which a request binding ahead of them spares), the arrival ring and
static fastest's schedule. Unbounded, one client could stop another's request from binding
accurately, or move the schedule every later request is judged against."""

from __future__ import annotations

import math
import re

DEADLINE_PARAMETER = "compass_deadline_ns"
# A deadline further than this many SLOs after the take-up counts as that far: no request waits
# ten SLOs for a reply, and further would only hold more of the shared schedule.
MAX_DEADLINE_SLOS = 10
# Where the router knows no SLO: an hour (the longest latency a policy may name).
MAX_DEADLINE_AHEAD_NS = 3_600 * 10**9
# Digits of the longest ns since the epoch int64 holds: a longer number is far beyond any
# deadline, read as such without converting it (Python converts no more than 4,300 digits).
MAX_DEADLINE_DIGITS = 19
_FAR: int = 10**MAX_DEADLINE_DIGITS
_INTEGER = re.compile(r"\s*([+-]?)0*(\d+)\s*")


def parse_deadline(value: object) -> int:
    """A request's ``compass_deadline_ns`` (an int, or a string of one) as an int whose size is
    bounded (a longer number reads as 10**19, past every deadline's clamp, signed as given);
    ValueError naming the parameter for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{DEADLINE_PARAMETER} {value!r:.40}: give ns since the epoch")
    if isinstance(value, int):
        return max(-_FAR, min(value, _FAR))
    text = value
    match = _INTEGER.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{DEADLINE_PARAMETER} {text[:40]!r} is not an integer: give ns since the epoch"
        )
    sign, digits = match.groups()
    far = _FAR if len(digits) > MAX_DEADLINE_DIGITS else int(digits)
    return -far if sign == "-" else far


def deadline_reach_ns(slo_ms: float | None) -> int:
    """How far after its take-up a deadline may count: MAX_DEADLINE_SLOS SLOs, or without an
    SLO MAX_DEADLINE_AHEAD_NS."""
    if slo_ms is None:
        return MAX_DEADLINE_AHEAD_NS
    return min(int(MAX_DEADLINE_SLOS * slo_ms * 1e6), MAX_DEADLINE_AHEAD_NS)


def bounded_deadline(deadline_ns: int, taken_up_ns: int, slo_ms: float | None) -> int:
    """The deadline a request is judged and bound by: the client's, no later than its take-up
    plus ``deadline_reach_ns`` and no earlier than as much before it (a deadline past at its
    take-up is late whatever serves it: refused or served on the fastest as admission says)."""
    reach = deadline_reach_ns(slo_ms)
    return max(taken_up_ns - reach, min(deadline_ns, taken_up_ns + reach))


def gate_deadline(deadline_ns: int | None, taken_up_ns: int) -> int:
    """What the gate's table holds for a request (0: no deadline); one already past at
    take-up holds 1, long past. The request binding ahead counts it as an ordinary request
    where the table has an SLO (follower_left_ms); a past one, late whatever serves it, never
    counts as slack to spare without."""
    if deadline_ns is None:
        return 0
    return deadline_ns if deadline_ns > taken_up_ns else 1


def follower_left_ms(deadline_ns: int, queued_ns: int, now_ns: int, slo_ms: float | None) -> float:
    """What is left, ``now_ns``, of a follower's time as the request binding ahead of it at
    the gate spares it: as long as an ordinary request queued when it was has (its queueing
    plus the SLO), whatever deadline its client sent; inf for one the gate holds none for (0).
    A client's deadline so binds its own request only: a tight one never makes
    the requests ahead of it hurry onto quicker, less accurate configurations. Without an
    SLO there is no ordinary deadline: the client's counts."""
    if not deadline_ns:
        return math.inf
    if slo_ms is None:
        return (deadline_ns - now_ns) / 1e6
    return (queued_ns - now_ns) / 1e6 + slo_ms


def arrival_ns(deadline_ns: int, taken_up_ns: int, slo_ms: float) -> int:
    """When a request arrived, from its deadline less the SLO, within the SLO before its
    take-up (a client's deadline further ahead or long past must not move the pod's arrival
    rate or static fastest's schedule)."""
    slo_ns = int(slo_ms * 1e6)
    return max(taken_up_ns - slo_ns, min(deadline_ns - slo_ns, taken_up_ns))

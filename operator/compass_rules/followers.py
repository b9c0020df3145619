"""What a request binding a stage leaves to the requests behind it: each follower's slack, the
joint plan that spends it where it buys the most accuracy, and the lag cap against the schedule
static fastest keeps (docs/serving.md, "Late binding")."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from compass_rules.binding import (
    ROUNDING_MS,
    BoolArray,
    FloatArray,
    consistent_remaining_ms,
    quickest_remaining_ms,
)

# The joint plan's grid: extra time in steps of at least this, ms, over at most JOINT_STEPS;
# a step's cost, far below any accuracy a choice adds, prefers the plan with less extra time.
JOINT_STEP_MS = 1.0
JOINT_STEPS = 128
JOINT_STEP_COST = 1e-7

Known = dict[str, tuple[BoolArray, FloatArray]]


def follower_slacks_ms(
    own_fastest_ms: float,
    followers_left_ms: Sequence[float],
    follower_ms: float,
    servers: int = 1,
    *,
    likely: tuple[float, float] | None = None,
) -> list[float | None]:
    """How much longer than its fastest completion a request may take without making each
    request waiting behind it (FIFO) late (None: a follower that does not count).

    Each follower, in order, starts once the work ahead of it is done: this request at its
    fastest and the followers before it at ``follower_ms`` each, shared by ``servers``; its
    slack is what is left of its deadline after it, and extra time e here delays it by about
    e / ``servers``. A follower counts where it would be in time with ``likely`` (this
    request's and each follower's time at admission's quantile; the same times without):
    followers late even so are left out (admission deals with them), and one that counts with
    no slack at the cautious times leaves none."""
    if servers < 1:
        raise ValueError(f"servers: {servers} is not >= 1; give the router instances")
    own_likely, follower_likely = likely or (own_fastest_ms, follower_ms)
    slacks: list[float | None] = []
    ahead, ahead_likely = own_fastest_ms, own_likely
    for left in followers_left_ms:
        if left + ROUNDING_MS >= ahead_likely / servers + follower_likely:
            slack = left - (ahead / servers + follower_ms)
            slacks.append(max(slack, 0.0) * servers)
        else:
            slacks.append(None)
        ahead += follower_ms
        ahead_likely += follower_likely
    return slacks


def polled_followers_left_ms(count: int, own_left_ms: float) -> list[float]:
    """What is left of the deadlines of ``count`` requests waiting behind a request where only
    their number is known (a poll of Triton's pending count): each arrived after it, so has at
    least as long left; taken as exactly that (clumps of simultaneous arrivals do), which never
    spares a follower less than it needs."""
    return [own_left_ms] * max(count, 0)


def slacks_behind_ms(
    table: Mapping[str, Any],
    bound: Mapping[str, Any],
    at: int,
    backlog_ms: Sequence[float],
    followers_left_ms: Sequence[float],
    servers: int,
    known: Known | None = None,
) -> list[float | None]:
    """``follower_slacks_ms`` on a table: the request's quickest completion from stage ``at``
    (consistent with ``bound``), each follower at the fastest configuration."""
    if not followers_left_ms:
        return []
    fastest_ms, fastest_likely_ms = table["arrays"]["fastest_ms"]
    return follower_slacks_ms(
        quickest_remaining_ms(table, bound, at, backlog_ms, "stage_ms", known),
        followers_left_ms,
        fastest_ms,
        servers,
        likely=(
            quickest_remaining_ms(table, bound, at, backlog_ms, "admit_ms", known),
            fastest_likely_ms,
        ),
    )


def joint_options(
    table: Mapping[str, Any],
    bound: Mapping[str, Any],
    at: int,
    left_ms: float,
    backlog_ms: Sequence[float],
    allowed: Collection[int] | None = None,
    known: Known | None = None,
) -> tuple[FloatArray, FloatArray]:
    """What ``joint_spare_ms`` plans with, as (extra ms, accuracy) rows: the request's choices
    (the configurations consistent with ``bound`` that ``allowed`` holds, or its fastest
    completion, that fit ``left_ms``; extra over its fastest completion from stage ``at``) and a
    follower's, not yet bound (the allowed configurations and the fastest; extra over the
    fastest configuration)."""
    arrays = table["arrays"]
    consistent, times = consistent_remaining_ms(table, bound, at, backlog_ms, known=known)
    if not consistent.any():
        consistent = np.ones_like(consistent)
    quickest = times[consistent].min()
    permitted = np.ones(len(times), dtype=bool)
    if allowed is not None:
        permitted[:] = False
        permitted[list(allowed)] = True
    mine = consistent & (times <= left_ms) & (permitted | (times == quickest))
    accuracy = arrays["accuracy"]
    own = np.column_stack((times[mine] - quickest, accuracy[mine]))
    permitted[arrays["fastest"]] = True
    extra = arrays["total_ms"] - arrays["fastest_ms"][0]
    return own, np.column_stack((extra[permitted], accuracy[permitted]))


def joint_spare_ms(
    own_options: Sequence[tuple[float, float]] | FloatArray,
    follower_options: Sequence[tuple[float, float]] | FloatArray,
    slacks_ms: Sequence[float | None],
    servers: int = 1,
    budget_ms: float = math.inf,
) -> float:
    """How much longer than its fastest completion a request may take in the best plan for it
    and the requests waiting behind it together (Aragog's choice over the FIFO queue).

    ``own_options`` are the request's choices as (extra time over its fastest completion,
    accuracy), ``follower_options`` a waiting request's (extra time over the fastest
    configuration, accuracy), ``slacks_ms`` each follower's slack in order
    (``follower_slacks_ms``; None: it does not count, so takes the fastest). A plan gives
    each a choice such that every counted follower stays in time (the extra time ahead of it
    over ``servers``, plus its own, within its slack over ``servers``) and all the extra time
    together stays within ``budget_ms`` (the lag cap's spare: each extra ms is a lag for the
    rest of the busy period); the best has the most accuracy in all, and among equals the
    most for the request itself (its choice is sure, the followers' are not: each chooses
    again when it is bound, on what it sees then). This keeps the first request from spending
    the slack that several behind it could use better. inf when no follower counts."""
    if servers < 1:
        raise ValueError(f"servers: {servers} is not >= 1; give the router instances")
    counted = [s for s in slacks_ms if s is not None]
    if not counted:
        return math.inf
    if not len(own_options):
        # Nothing fits its deadline: its fastest completion, whatever the plan.
        return 0.0
    # The most extra time any plan can hold: no counted follower allows more than its slack.
    reach_ms = min(budget_ms, max(counted))
    step = max(JOINT_STEP_MS, reach_ms / JOINT_STEPS)
    size = math.floor(reach_ms / step + 1e-9) + 1
    # A follower's options on the grid (extra time rounds up), only those no other beats on
    # both counts (the plan's cost grows with their number): the most accurate at each step,
    # if more accurate than every quicker one. The fastest (0 steps) is always one.
    theirs = np.asarray(follower_options, dtype=float).reshape(-1, 2)
    their_steps = np.ceil(np.maximum(theirs[:, 0], 0.0) / step - 1e-9).astype(int)
    order = np.lexsort((-theirs[:, 1], their_steps))
    kept_steps, kept_gains = [0], [0.0]
    for k, gain in zip(their_steps[order].tolist(), theirs[order, 1].tolist(), strict=True):
        if gain > kept_gains[-1]:
            if k == kept_steps[-1]:
                kept_gains[-1] = gain
            else:
                kept_steps.append(k)
                kept_gains.append(gain)
    steps = np.array(kept_steps)
    # Among plans of equal accuracy the one with the least extra time in all (less lag for
    # the arrivals to come).
    gains = (np.array(kept_gains) - JOINT_STEP_COST * steps)[:, None]
    # Backwards over the followers: ahead[t], the most accuracy the followers from here on
    # can add where the extra time ahead of them is t steps (-inf: one of them late). Going
    # from t to t + k steps, a follower's limit holds t + k * servers (the extra ahead of it
    # and its own, x servers); an index past the grid is -inf (the pad).
    totals = np.arange(size)
    after = np.minimum(totals[None, :] + steps[:, None], size)
    ahead_and_own = totals[None, :] + steps[:, None] * servers
    ahead = np.zeros(size + 1)
    ahead[size] = -np.inf
    for slack in reversed(slacks_ms):
        if slack is None:
            # It takes the fastest: nothing changes for those behind it.
            continue
        value = ahead[after] + gains
        value[ahead_and_own > math.floor(slack / step + 1e-9)] = -np.inf
        ahead[:size] = value.max(axis=0)
    # The request's own choice: its accuracy and the best its followers can add after it;
    # the most in all, and among equals the most for itself (its choice is sure, theirs not).
    own = np.asarray(own_options, dtype=float).reshape(-1, 2)
    own_steps = np.minimum(np.ceil(own[:, 0] / step - 1e-9).astype(int), size)
    total = own[:, 1] - JOINT_STEP_COST * own_steps + ahead[own_steps]
    if not np.isfinite(total).any():
        return 0.0
    best = total >= total.max() - 1e-9
    return float(own_steps[best].max()) * step


def lag_cap_ms(share: float, slo_ms: float, reserve: int, fastest_likely_ms: float) -> float:
    """How far a request may end behind static fastest's schedule: ``share`` of the SLO less
    ``reserve`` of the fastest's likely times."""
    return share * max(slo_ms - reserve * fastest_likely_ms, 0.0)


def lag_room_ms(cap_ms: float, behind_ms: float) -> float:
    """How much longer than its fastest completion a request may take that would end
    ``behind_ms`` behind static fastest's schedule at its fastest, so that it ends no more than
    ``cap_ms`` behind: every request after it in the same busy period starts that much later
    than static fastest starts it, so a lag is what a clump arriving behind it pays."""
    return max(cap_ms - behind_ms, 0.0)


def lag_spare_ms(
    table: Mapping[str, Any],
    bound: Mapping[str, Any],
    at: int,
    backlog_ms: Sequence[float],
    now_ns: int,
    static_start_ns: int | None,
    known: Known | None = None,
) -> float:
    """``lag_room_ms`` on a table whose ``lag_share`` caps the lag (inf where none does, or the
    request has no ``static_start_ns``: when static fastest would start it, ns since the
    epoch): its quickest likely completion from stage ``at`` now against the fastest's likely
    time from that start."""
    share = table["lag_share"]
    if share is None or static_start_ns is None:
        return math.inf
    quickest_likely = quickest_remaining_ms(table, bound, at, backlog_ms, "admit_ms", known)
    fastest_likely_ms = table["arrays"]["fastest_ms"][1]
    cap_ms = lag_cap_ms(share, table["slo_ms"], table["lag_reserve"], fastest_likely_ms)
    behind_ms = (now_ns - static_start_ns) / 1e6 + quickest_likely - fastest_likely_ms
    return lag_room_ms(cap_ms, behind_ms)


def static_schedule(arrival: float, free: float, service: float) -> tuple[float, float]:
    """When a request arriving at ``arrival`` starts if every request were served on the
    fastest configuration (``service`` each, per server), that queue being free at ``free``,
    and when it is free again after it (Lindley's recursion: the schedule static fastest keeps).
    Integers in, integers out (a router's ns)."""
    start = max(arrival, free)
    return start, start + service

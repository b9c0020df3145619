"""What the routers served (status.served): their counters, turned into counts over a recent
window and into the policy's view of them. Pure: every time is an input."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The window status.served covers, and how far apart a counter's samples are kept.
SERVED_WINDOW_S = 60.0
SAMPLE_EVERY_S = 5.0
# The configurations status.served lists, most served first (the rest are in its totals).
MAX_SHOWN = 8


@dataclass(frozen=True)
class StreamCounts:
    """A decoupled router's streams answered and their summed times to first response and end."""

    streams: float = 0.0
    first_s: float = 0.0
    end_s: float = 0.0

    def plus(self, other: StreamCounts) -> StreamCounts:
        """Both together."""
        return StreamCounts(
            self.streams + other.streams, self.first_s + other.first_s, self.end_s + other.end_s
        )

    @property
    def mean_first_s(self) -> float | None:
        """The mean time to the first streamed response (to first token); None: no stream."""
        return self.first_s / self.streams if self.streams > 0 else None

    @property
    def mean_end_s(self) -> float | None:
        """The mean time to a stream's end (end to end); None: no stream."""
        return self.end_s / self.streams if self.streams > 0 else None


@dataclass(frozen=True)
class ServedCounts:
    """Requests answered per configuration key and refused as late, and streams (None: none)."""

    configs: Mapping[str, float] = field(default_factory=dict)
    refused: float = 0.0
    seconds: float = 0.0
    streams: StreamCounts | None = None

    @property
    def answered(self) -> float:
        """Requests answered, every configuration together."""
        return sum(self.configs.values())

    def plus(self, other: ServedCounts) -> ServedCounts:
        """Both together (two pods' counts over the same window)."""
        configs = dict(self.configs)
        for key, count in other.configs.items():
            configs[key] = configs.get(key, 0.0) + count
        streams = self.streams
        if other.streams is not None:
            streams = other.streams if streams is None else streams.plus(other.streams)
        return ServedCounts(
            configs, self.refused + other.refused, max(self.seconds, other.seconds), streams
        )


@dataclass(frozen=True)
class RouterCounters:
    """A pod's router counters as read, by (configuration key, instance) and by instance."""

    served: Mapping[tuple[str, str], float] = field(default_factory=dict)
    refused: Mapping[str, float] = field(default_factory=dict)
    streams: Mapping[str, StreamCounts] = field(default_factory=dict)


@dataclass
class CounterHistory:
    """One pod's router counters sampled over time, to tell what they counted over a window."""

    samples: list[tuple[float, RouterCounters]] = field(default_factory=list)

    def add(self, now: float, counters: RouterCounters) -> None:
        """Record the counters read at ``now``, keeping one sample every SAMPLE_EVERY_S."""
        if len(self.samples) >= 2 and self.samples[-1][0] - self.samples[-2][0] < SAMPLE_EVERY_S:
            self.samples[-1] = (now, counters)
        else:
            self.samples.append((now, counters))
        # The oldest sample kept is the last one at or before the longest window's start.
        while len(self.samples) > 2 and self.samples[1][0] <= now - SERVED_WINDOW_S:
            del self.samples[0]

    def since(self, now: float, window_s: float) -> ServedCounts | None:
        """What the counters counted in the ``window_s`` to ``now`` (None before two samples)."""
        start = now - window_s
        kept = [sample for sample in self.samples if sample[0] > start]
        earlier = [sample for sample in self.samples if sample[0] <= start]
        if earlier:
            kept.insert(0, earlier[-1])
        if len(kept) < 2:
            return None
        configs: dict[str, float] = {}
        refused = 0.0
        streams: StreamCounts | None = None
        for (t0, before), (t1, after) in itertools.pairwise(kept):
            inside = 1.0 if t0 >= start else (t1 - start) / (t1 - t0)
            for (key, instance), count in after.served.items():
                was = before.served.get((key, instance))
                configs[key] = configs.get(key, 0.0) + inside * _increase(was, count)
            for instance, count in after.refused.items():
                refused += inside * _increase(before.refused.get(instance), count)
            for instance, times in after.streams.items():
                more = _stream_increase(before.streams.get(instance), times, inside)
                streams = more if streams is None else streams.plus(more)
        span = kept[-1][0] - max(kept[0][0], start)
        return ServedCounts({k: v for k, v in configs.items() if v > 0}, refused, span, streams)


def _increase(before: float | None, after: float) -> float:
    """A counter's increase between two readings (a reset, or a series new since: all of it)."""
    if before is None or after < before:
        return after
    return after - before


def _stream_increase(
    before: StreamCounts | None, after: StreamCounts, inside: float
) -> StreamCounts:
    """An instance's stream counters' increase, the share ``inside`` the window of it. The three
    reset together: any of them lower is a restart (one alone would pair times with others)."""
    if before is not None and (
        after.streams < before.streams
        or after.first_s < before.first_s
        or after.end_s < before.end_s
    ):
        before = None
    was = before or StreamCounts()
    return StreamCounts(
        inside * (after.streams - was.streams),
        inside * (after.first_s - was.first_s),
        inside * (after.end_s - was.end_s),
    )


@dataclass(frozen=True)
class ServedShare:
    """One configuration's share of the requests answered."""

    name: str
    share: float
    accuracy: float | None


@dataclass(frozen=True)
class ServedView:
    """What the routers answered over a window: counts, accuracy, shares and stream times (s)."""

    seconds: float
    answered: int
    refused: int
    accuracy: float | None
    shares: tuple[ServedShare, ...]
    ttft_mean_s: float | None = None
    stream_mean_s: float | None = None


def served_view(counts: ServedCounts, known: Mapping[str, tuple[str, float]]) -> ServedView:
    """The view of ``counts``, named and weighed by ``known`` (the plan's front) by key."""
    total = counts.answered
    shares = []
    weighted = weight = 0.0
    for key, count in sorted(counts.configs.items(), key=lambda kv: (-kv[1], kv[0])):
        name, accuracy = known.get(key, (_name_of(key), None))
        if accuracy is not None:
            weighted += accuracy * count
            weight += count
        shares.append(ServedShare(name, count / total if total > 0 else 0.0, accuracy))
    return ServedView(
        seconds=counts.seconds,
        answered=round(total),
        refused=round(counts.refused),
        accuracy=weighted / weight if weight > 0 else None,
        shares=tuple(shares[:MAX_SHOWN]),
        ttft_mean_s=None if counts.streams is None else counts.streams.mean_first_s,
        stream_mean_s=None if counts.streams is None else counts.streams.mean_end_s,
    )


def _name_of(key: str) -> str:
    """A configuration's short name from its canonical key (one that is not, as it is)."""
    try:
        config = json.loads(key)
    except ValueError:
        return key
    if not isinstance(config, dict) or not config:
        return key or "(none)"
    return "/".join(str(value) for value in config.values())


def summed(counts: Sequence[ServedCounts]) -> ServedCounts | None:
    """Several routers' counts over one window together (None: none)."""
    return functools.reduce(ServedCounts.plus, counts) if counts else None

"""The router's custom metrics in Triton (no-ops on a Triton without custom metrics)."""

import contextlib

import triton_python_backend_utils as pb_utils

from compass_rules.protocol import (
    GATE_WAITING_METRIC,
    REFUSED_METRIC,
    SERVED_METRIC,
    STREAM_END_METRIC,
    STREAM_FIRST_METRIC,
    STREAMS_METRIC,
)


def _metric(name, description, kind, labels):
    """(family, series with ``labels`` or None), or (None, None) where they cannot be made; keep
    the family with its series (Triton refuses a metric whose family was collected)."""
    family_type = getattr(pb_utils, "MetricFamily", None)
    if family_type is None:
        return None, None
    try:
        family = family_type(name=name, description=description, kind=getattr(family_type, kind))
        return family, None if labels is None else family.Metric(labels=labels)
    except Exception:
        return None, None


class GateGauge:
    """This instance's GATE_WAITING_METRIC: 1 while its request waits at the gate, else 0."""

    def __init__(self, model, instance):
        # By Triton's instance name, which a restarted stub keeps: a killed waiter's 1 is zeroed.
        self.family, self.metric = _metric(
            GATE_WAITING_METRIC,
            "Requests a compass router instance holds at its gate, not yet in the pipeline "
            "(Triton counts them as executing, not pending)",
            "GAUGE",
            {"model": model, "instance": instance},
        )
        self.waiting(0)

    def waiting(self, count):
        """Set this instance's count (1 waiting, 0 not); a failed set never fails a request."""
        if self.metric is not None:
            with contextlib.suppress(Exception):
                self.metric.set(count)


# Served counts by configuration key (overrides left out): keys past SERVED_MAX_KEYS count as
# "other" (a binding table holds at most 128), so the series never grow without bound.
SERVED_MAX_KEYS = 160
SERVED_OTHER = "other"


class ServedCounters:
    """This instance's SERVED_METRIC (by configuration) and REFUSED_METRIC counters."""

    def __init__(self, model, instance):
        self.labels = {"model": model, "instance": instance}
        self.served = {}
        self.refused_family, self.refused = _metric(
            REFUSED_METRIC,
            "Requests a compass router instance refused as late (admission or late binding)",
            "COUNTER",
            self.labels,
        )
        # The served series are made as configurations are served (their key is a label).
        self.family = None
        if self.refused is not None:
            self.family, _ = _metric(
                SERVED_METRIC,
                "Requests a compass router instance answered, by the configuration that served "
                "them (its canonical key)",
                "COUNTER",
                None,
            )

    def served_one(self, key):
        """Count one request answered on configuration ``key``."""
        if self.family is None:
            return
        with contextlib.suppress(Exception):
            if key not in self.served and len(self.served) >= SERVED_MAX_KEYS:
                key = SERVED_OTHER
            if key not in self.served:
                self.served[key] = self.family.Metric(labels={**self.labels, "config": key})
            self.served[key].increment(1)

    def refused_one(self):
        """Count one request refused as late."""
        if self.refused is not None:
            with contextlib.suppress(Exception):
                self.refused.increment(1)


class StreamTimes:
    """This instance's stream counters (a failed count never fails a request)."""

    def __init__(self, model, instance):
        labels = {"model": model, "instance": instance}
        self.count_family, self.count = _metric(
            STREAMS_METRIC, "Streams a compass router instance answered", "COUNTER", labels
        )
        self.first_family, self.first = _metric(
            STREAM_FIRST_METRIC,
            "Seconds from take-up to each stream's first response, summed (time to first token)",
            "COUNTER",
            labels,
        )
        self.end_family, self.end = _metric(
            STREAM_END_METRIC,
            "Seconds from take-up to each stream's final response, summed (end to end)",
            "COUNTER",
            labels,
        )

    def streamed(self, first_s, end_s):
        """Count one stream: its first response after ``first_s`` (None: none), end ``end_s``."""
        with contextlib.suppress(Exception):
            if self.count is not None:
                self.count.increment(1)
            if self.first is not None:
                self.first.increment(end_s if first_s is None else first_s)
            if self.end is not None:
                self.end.increment(end_s)

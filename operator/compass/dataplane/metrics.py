"""Queue-depth sources behind one small protocol: Prometheus (PromQL) or Triton's /metrics."""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import urlencode

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.dataplane.httpauth import HttpAuth
from compass.dataplane.metricshttp import Http, checked_url, excerpt

# The sources' error, where their callers have always found it.
from compass.dataplane.metricshttp import MetricsUnavailableError as MetricsUnavailableError
from compass.domain.served import CounterHistory, RouterCounters, ServedCounts, StreamCounts
from compass_rules.protocol import (
    GATE_WAITING_METRIC,
    PENDING_METRIC,
    REFUSED_METRIC,
    SERVED_METRIC,
    STREAM_END_METRIC,
    STREAM_FIRST_METRIC,
    STREAMS_METRIC,
)

LOG = logging.getLogger(__name__)
Answer = TypeVar("Answer")
# The router's counters read for status.served, apart from the queue's reading.
ROUTER_COUNTERS = (
    SERVED_METRIC,
    REFUSED_METRIC,
    STREAMS_METRIC,
    STREAM_FIRST_METRIC,
    STREAM_END_METRIC,
)
# Past these a number read is a failed read, never a decision: no pod queues a billion, a float
# past 2**53 no longer counts by one, a day-old sample is not now, minutes ahead is a wrong clock.
MAX_QUEUE_DEPTH = 1e9
MAX_COUNTER = 2.0**53
MAX_SAMPLE_AGE_S = 86_400.0
MAX_FUTURE_S = 300.0


# vLLM's gauge of the requests waiting on a model server (the llm-d gateway's queue).
VLLM_WAITING_METRIC = "vllm:num_requests_waiting"


def _gate_waiting_term(model: str) -> str:
    """PromQL for the requests waiting at the router's gate: 0 where it has no gate."""
    return f'(sum({GATE_WAITING_METRIC}{{model="{model}"}}) or vector(0))'


def default_query(model: str = DEFAULT_ROUTER_MODEL) -> str:
    """PromQL for the router's queue: Triton's pending requests plus those at its gate."""
    return f'sum({PENDING_METRIC}{{model="{model}"}}) + {_gate_waiting_term(model)}'


def default_arrivals_query(model: str = DEFAULT_ROUTER_MODEL) -> str:
    """PromQL for the router's arrivals so far: finished plus still waiting."""
    counted = " + ".join(
        f'sum(nv_inference_{name}{{model="{model}"}})'
        for name in ("request_success", "request_failure", "pending_request_count")
    )
    return f"{counted} + {_gate_waiting_term(model)}"


def default_age_query(model: str = DEFAULT_ROUTER_MODEL) -> str:
    """PromQL for the queue samples' age (an instant query stamps even old samples "now")."""
    return f'time() - min(timestamp(nv_inference_pending_request_count{{model="{model}"}}))'


@dataclass(frozen=True)
class MetricsReading:
    """Queue depth and arrivals so far (None: unknown), per pod; ``age_s``: the samples' age."""

    queue_depth: float
    arrivals_total: float | None = None
    pods: int = 1
    age_s: float = 0.0


def _shown(value: float) -> str:
    """A number as Prometheus writes the special ones (+Inf, -Inf, NaN), else %g."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:g}"


def checked_count(value: float, what: str, where: str, high: float) -> float:
    """A count read from a metric if finite, >= 0 and at most ``high``."""
    if not math.isfinite(value):
        raise MetricsUnavailableError(f"{where}: {what} {_shown(value)} is not a finite number")
    if value < 0:
        raise MetricsUnavailableError(f"{where}: {what} {_shown(value)} is negative")
    if value > high:
        raise MetricsUnavailableError(f"{where}: {what} {_shown(value)} is above {high:g}")
    return value


def checked_age(value: float, where: str) -> float:
    """A sample's age (s), at most a day; a few minutes in the future (skew) is fresh (0)."""
    if not math.isfinite(value):
        raise MetricsUnavailableError(f"{where}: sample age {_shown(value)} is not a finite number")
    if value > MAX_SAMPLE_AGE_S:
        raise MetricsUnavailableError(
            f"{where}: sample age {_shown(value)} s is more than a day (a wrong timestamp?)"
        )
    if value < -MAX_FUTURE_S:
        raise MetricsUnavailableError(
            f"{where}: sample stamped {_shown(-value)} s in the future (a wrong timestamp or "
            "clock?)"
        )
    return max(value, 0.0)


class SharedReads:
    """Reads shared within one tick: a thousand policies asking the same make one request."""

    def __init__(self) -> None:
        self._answers: dict[tuple[Any, ...], _SharedAnswer] = {}
        self._lock = threading.Lock()

    def next_round(self) -> None:
        """Forget the answers of the last round: the next asks read afresh."""
        with self._lock:
            self._answers = {}

    def once(
        self,
        key: tuple[Any, ...],
        read: Callable[[], Any],
        errors: tuple[type[Exception], ...] = (),
    ) -> Any:
        """``read()``'s answer (or error, raised anew to each) for ``key`` in this round."""
        with self._lock:
            answer = self._answers.get(key)
            first = answer is None
            if answer is None:
                answer = self._answers[key] = _SharedAnswer()
        if first:
            caught: tuple[type[Exception], ...] = (MetricsUnavailableError, *errors)
            try:
                answer.value = read()
            except caught as error:
                answer.error = error
            finally:
                answer.done.set()
        else:
            answer.done.wait()
        if answer.error is not None:
            raise type(answer.error)(str(answer.error))
        return answer.value


@dataclass
class _SharedAnswer:
    """One read of a round: its value or its error, once done."""

    value: Any = None
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)


def shared_read(
    shared: SharedReads | None,
    key: tuple[Any, ...],
    read: Callable[[], Answer],
    errors: tuple[type[Exception], ...] = (),
) -> Answer:
    """``read()``, shared within the round when there is a SharedReads."""
    return read() if shared is None else cast(Answer, shared.once(key, read, errors))


class QueueDepthSource(Protocol):
    """Reads the current queue depth of the router."""

    def describe(self) -> str:
        """Where the number comes from, for logs and conditions."""
        ...

    def read(self) -> MetricsReading:
        """Queue depth and the arrivals counter; raises MetricsUnavailableError."""
        ...

    def served(self, window_s: float) -> ServedCounts | None:
        """What the routers served over about ``window_s`` (None: unknown or not counted)."""
        ...


class PrometheusQueueDepth:
    """A PromQL instant query of one number: a total over pods, divided by ``pods`` if given."""

    def __init__(
        self,
        url: str,
        query: str | None = None,
        timeout_s: float = 2.0,
        arrivals_query: str | None = None,
        pods: Callable[[], int] | None = None,
        age_query: str | None = None,
        auth: HttpAuth | None = None,
        shared: SharedReads | None = None,
        model: str | None = None,
    ) -> None:
        self.url = checked_url(url)
        # The router model whose served counters served() reads (None: it reads none).
        self.model = model
        self.pods = pods
        self.shared = shared
        self.query = query or default_query()
        self.arrivals_query = arrivals_query
        self.age_query = age_query
        self.timeout_s = timeout_s
        # No retries: the caller polls every second and must hear of an outage now.
        self.http = Http(auth)

    @property
    def auth_rejected(self) -> bool:
        """Whether the last request was answered 401 or 403."""
        return self.http.rejected

    def describe(self) -> str:
        """Prometheus URL and query."""
        return f"Prometheus {self.url} query {self.query}"

    def read(self) -> MetricsReading:
        """Queue depth, and arrivals when an arrivals query is configured."""
        depth = self._count(self.query, "queue depth", MAX_QUEUE_DEPTH)
        arrivals = None
        if self.arrivals_query:
            arrivals = self._count(self.arrivals_query, "arrivals counter", MAX_COUNTER)
        # On Prometheus' clock alone, so no skew with this one.
        age = (
            checked_age(self._scalar(self.age_query), self._where(self.age_query))
            if self.age_query
            else 0.0
        )
        pods = max(self.pods(), 1) if self.pods is not None else 1
        return MetricsReading(
            depth / pods, None if arrivals is None else arrivals / pods, pods, age_s=age
        )

    def served(self, window_s: float) -> ServedCounts | None:
        """What the routers of this source's model served over ``window_s`` (PromQL increase())."""
        model = self.model
        if model is None:
            return None
        window = f"{max(round(window_s), 1)}s"
        by_config = self._vector(
            f'sum by (config) (increase({SERVED_METRIC}{{model="{model}"}}[{window}]))'
        )
        refused = self._vector(f'sum(increase({REFUSED_METRIC}{{model="{model}"}}[{window}]))')
        if not by_config and not refused:
            return None
        where = f"Prometheus {self.url} {SERVED_METRIC}"
        counted = {
            labels.get("config", ""): checked_count(value, "served count", where, MAX_COUNTER)
            for labels, value in by_config
        }
        total_refused = sum(
            checked_count(value, "refused count", where, MAX_COUNTER) for _, value in refused
        )
        configs = {key: count for key, count in counted.items() if count > 0}
        return ServedCounts(configs, total_refused, window_s, self._streams(model, window))

    def _streams(self, model: str, window: str) -> StreamCounts | None:
        """A decoupled router's streams and summed times over ``window``; None: no streams."""
        totals = []
        for metric in (STREAMS_METRIC, STREAM_FIRST_METRIC, STREAM_END_METRIC):
            series = self._vector(f'sum(increase({metric}{{model="{model}"}}[{window}]))')
            if not series:
                return None
            where = f"Prometheus {self.url} {metric}"
            totals.append(checked_count(series[0][1], "stream counter", where, MAX_COUNTER))
        return StreamCounts(*totals)

    def _vector(self, query: str) -> list[tuple[dict[str, str], float]]:
        """Evaluate a query's series (labels, value), once a round as _scalar is; NaN dropped."""
        key = ("prometheus-vector", self.url, query, self.timeout_s, self.http.auth)
        return shared_read(self.shared, key, lambda: self._evaluate_series(query))

    def _count(self, query: str, what: str, high: float) -> float:
        return checked_count(self._scalar(query), what, self._where(query), high)

    def _scalar(self, query: str) -> float:
        """Evaluate a query that must return one number (once a round)."""
        key = ("prometheus", self.url, query, self.timeout_s, self.http.auth)
        return shared_read(self.shared, key, lambda: self._evaluate(query))

    def _evaluate(self, query: str) -> float:
        """Evaluate a query now: its one sample's value."""
        result = self._result(query)
        if not result:
            raise MetricsUnavailableError(
                f"{self._where(query)}: no series (is Prometheus scraping Triton's metrics port, "
                f"and is the model name right?)"
            )
        if len(result) > 1:
            raise MetricsUnavailableError(
                f"{self._where(query)}: {len(result)} series; aggregate them, e.g. sum(...)"
            )
        try:
            value = float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as error:
            LOG.warning("%s: unreadable result: %s", self._where(query), excerpt(repr(result)))
            raise MetricsUnavailableError(
                f"{self._where(query)}: the answer holds no readable sample"
            ) from error
        if math.isnan(value):
            raise MetricsUnavailableError(f"{self._where(query)}: the query returned NaN")
        return value

    def _evaluate_series(self, query: str) -> list[tuple[dict[str, str], float]]:
        """Evaluate a query now: each series' labels and value (NaN left out)."""
        result = self._result(query)
        try:
            series = [(dict(r.get("metric") or {}), float(r["value"][1])) for r in result]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            LOG.warning("%s: unreadable result: %s", self._where(query), excerpt(repr(result)))
            raise MetricsUnavailableError(
                f"{self._where(query)}: the answer holds no readable sample"
            ) from error
        return [(labels, value) for labels, value in series if not math.isnan(value)]

    def _result(self, query: str) -> list[dict[str, Any]]:
        """The result of a query now, as the query API gives it."""
        where = self._where(query)
        params = {"query": query, "timeout": f"{round(self.timeout_s * 1000)}ms"}
        url = f"{self.url.rstrip('/')}/api/v1/query?{urlencode(params)}"
        data = self.http.get(url, self.timeout_s, where)
        try:
            answer = json.loads(data)
            if answer["status"] != "success":
                raise ValueError("not a success")
            result = answer["data"]["result"]
        except (ValueError, KeyError, TypeError) as error:  # a 200 that is not the query API
            LOG.warning("%s: not the query API: %s", where, excerpt(data))
            raise MetricsUnavailableError(
                f"{where}: the answer is not Prometheus' query API (JSON)"
            ) from error
        if not isinstance(result, list):
            raise MetricsUnavailableError(f"{where}: the answer holds no readable sample")
        return result

    def _where(self, query: str) -> str:
        return f"Prometheus {self.url} query {query}"


@dataclass(frozen=True)
class UnavailableSource:
    """A source whose configuration is broken (a missing Secret): every read fails."""

    where: str
    problem: str

    def describe(self) -> str:
        """Where the number would come from."""
        return self.where

    def read(self) -> MetricsReading:
        """Never a reading."""
        raise MetricsUnavailableError(self.problem)

    def served(self, window_s: float) -> ServedCounts | None:
        """Never known."""
        return None


# A label value may hold any character, '}' too (the router's config label is JSON), escaped
# as the exposition format escapes it (\\, \", \n).
_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?'
    r"\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_ESCAPED = re.compile(r"\\(.)")


def _label_value(raw: str) -> str:
    """A label value as written in the exposition format, unescaped."""
    return _ESCAPED.sub(lambda m: "\n" if m[1] == "n" else m[1], raw)


class TritonQueueDepth:
    """Triton's own /metrics, scraped directly: no Prometheus in between, no scrape delay."""

    def __init__(
        self,
        metrics_url: str,
        model: str | None = DEFAULT_ROUTER_MODEL,
        metric: str = PENDING_METRIC,
        timeout_s: float = 2.0,
        auth: HttpAuth | None = None,
        shared: SharedReads | None = None,
    ) -> None:
        self.metrics_url = checked_url(metrics_url)
        self.model = model
        self.metric = metric
        self.timeout_s = timeout_s
        self.http = Http(auth)
        self.shared = shared
        # The arrivals counter given at the last reading and the finished count behind it.
        self.counted: tuple[float, float] | None = None
        self.lock = threading.Lock()
        # The router's served counters as read (on the monotonic clock), for served().
        self.served_history = CounterHistory()

    @property
    def auth_rejected(self) -> bool:
        """Whether the last scrape was answered 401 or 403."""
        return self.http.rejected

    def describe(self) -> str:
        """Metrics URL and series (the pending count with the gate's waiters: as read)."""
        if self.model is None:
            return f"model server metrics {self.metrics_url} {self.metric}, summed"
        # A router's pending count (the only metric read with a model) with its gate's waiters.
        series = f"{PENDING_METRIC} + {GATE_WAITING_METRIC}"
        return f"Triton metrics {self.metrics_url} {series}{{model={self.model!r}}}"

    def queue_depth(self) -> float:
        """Scrape once; the router's pending requests summed over versions."""
        return self.read().queue_depth

    def read(self) -> MetricsReading:
        """Scrape once (once a round): pending requests, and arrivals = finished + pending."""
        key = ("triton", self.metrics_url, self.model, self.metric, self.timeout_s, self.http.auth)
        pending, finished, served = shared_read(self.shared, key, self._scrape)
        with self.lock:
            if served is not None:
                self.served_history.add(time.monotonic(), served)
            if None in finished:
                return MetricsReading(pending, None)
            arrivals = self._count(sum(f or 0.0 for f in finished), pending)
        return MetricsReading(pending, arrivals)

    def served(self, window_s: float) -> ServedCounts | None:
        """What the router counted over about ``window_s``, from this source's own readings."""
        with self.lock:
            return self.served_history.since(time.monotonic(), window_s)

    def _scrape(self) -> tuple[float, list[float | None], RouterCounters | None]:
        """Pending requests, finished counters (success, failure) and the router's counters."""
        data = self.http.get(self.metrics_url, self.timeout_s, self.describe())
        totals: dict[str, float] = {}
        counters: list[tuple[str, dict[str, str], str]] = []
        # Other models' lines are skipped unparsed; a model server (model None) counts them all.
        selector = self.metric if self.model is None else f'model="{self.model}"'
        for line in data.decode("utf-8", errors="replace").splitlines():
            if selector not in line:
                continue
            match = _SAMPLE.match(line)
            if not match:
                continue
            labels = dict(_LABEL.findall(match["labels"] or ""))
            if self.model is None and match["name"] != self.metric:
                continue
            if self.model is not None and labels.get("model") != self.model:
                continue
            if match["name"] in ROUTER_COUNTERS:
                # For the status alone: read apart, so a bad counter never fails the decision.
                counters.append((match["name"], labels, match["value"]))
                continue
            try:
                value = float(match["value"])
            except ValueError as error:
                LOG.warning("%s: unreadable sample: %s", self.describe(), excerpt(line))
                raise MetricsUnavailableError(
                    f"{self.describe()}: an unreadable sample value"
                ) from error
            totals[match["name"]] = totals.get(match["name"], 0.0) + value
        if self.metric not in totals:
            raise MetricsUnavailableError(
                f"{self.describe()}: no such series (is the model loaded?)"
            )
        waiting = totals[self.metric]
        if self.metric == PENDING_METRIC:
            # Behind the router's gate its instances hold the queue: Triton counts it executing.
            waiting += totals.get(GATE_WAITING_METRIC, 0.0)
        pending = checked_count(waiting, self.metric, self.describe(), MAX_QUEUE_DEPTH)
        finished = [
            checked_count(totals[name], name, self.describe(), MAX_COUNTER)
            if (name := f"nv_inference_request_{k}") in totals
            else None
            for k in ("success", "failure")
        ]
        return pending, finished, self._router_counters(counters)

    def _router_counters(
        self, samples: list[tuple[str, dict[str, str], str]]
    ) -> RouterCounters | None:
        """The router's counters (a stream's only all three together); None: none or unreadable."""
        if not samples:
            return None
        served: dict[tuple[str, str], float] = {}
        refused: dict[str, float] = {}
        streams: dict[str, dict[str, float]] = {}
        where = f"{self.describe()} {SERVED_METRIC}"
        try:
            for name, labels, text in samples:
                try:
                    value = checked_count(float(text), name, where, MAX_COUNTER)
                except ValueError as error:
                    raise MetricsUnavailableError(f"{where}: an unreadable {name}") from error
                instance = _label_value(labels.get("instance", ""))
                if name == SERVED_METRIC:
                    served[_label_value(labels.get("config", "")), instance] = value
                elif name == REFUSED_METRIC:
                    refused[instance] = value
                else:
                    streams.setdefault(instance, {})[name] = value
        except MetricsUnavailableError as error:
            LOG.warning("%s", error)
            return None
        whole = {
            instance: StreamCounts(
                times[STREAMS_METRIC], times[STREAM_FIRST_METRIC], times[STREAM_END_METRIC]
            )
            for instance, times in streams.items()
            if len(times) == 3
        }
        return RouterCounters(served, refused, whole)

    def _count(self, finished: float, pending: float) -> float:
        """Arrivals so far (finished + pending), held at its highest (a dip is lag) till restart."""
        arrivals = finished + pending
        if self.counted is not None:
            highest, finished_before = self.counted
            if finished >= finished_before:
                arrivals = max(arrivals, highest)
        self.counted = (arrivals, finished)
        return arrivals


def source_for(
    kind: str,
    url: str,
    model: str = DEFAULT_ROUTER_MODEL,
    query: str | None = None,
    arrivals_query: str | None = None,
    pods: Callable[[], int] | None = None,
    age_query: str | None = None,
    auth: HttpAuth | None = None,
    shared: SharedReads | None = None,
) -> QueueDepthSource:
    """The metrics source a policy names: prometheus, triton or vllm."""
    if kind == "triton":
        return TritonQueueDepth(url, model=model, auth=auth, shared=shared)
    if kind == "vllm":
        return TritonQueueDepth(url, None, VLLM_WAITING_METRIC, auth=auth, shared=shared)
    if kind == "prometheus":
        return PrometheusQueueDepth(
            url,
            query or default_query(model),
            arrivals_query=arrivals_query or default_arrivals_query(model),
            pods=pods,
            age_query=age_query or (None if query else default_age_query(model)),
            auth=auth,
            shared=shared,
            model=model,
        )
    raise ValueError(f"metrics type {kind!r}: use prometheus, triton or vllm")

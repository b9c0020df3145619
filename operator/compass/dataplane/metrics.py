"""Queue-depth sources behind one small protocol: Prometheus (PromQL) or Triton's /metrics."""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from compass.api.meta import DEFAULT_ROUTER_MODEL


def default_query(model: str = DEFAULT_ROUTER_MODEL) -> str:
    """PromQL for the router's queue: Triton's pending requests, summed over versions."""
    return f'sum(nv_inference_pending_request_count{{model="{model}"}})'


def default_arrivals_query(model: str = DEFAULT_ROUTER_MODEL) -> str:
    """PromQL for the router's arrivals so far: finished (ok or failed) plus still pending."""
    return " + ".join(
        f'sum(nv_inference_{name}{{model="{model}"}})'
        for name in ("request_success", "request_failure", "pending_request_count")
    )


@dataclass(frozen=True)
class MetricsReading:
    """One reading: the queue depth now and, when known, a counter of arrivals so far.

    Read from several pods, both are per pod (``pods`` of them): the depth aggregated over the
    pods, the counter the arrivals divided among them.
    """

    queue_depth: float
    arrivals_total: float | None = None
    pods: int = 1


class MetricsUnavailableError(RuntimeError):
    """The queue depth could not be read; the message names the source and the cause."""


class QueueDepthSource(Protocol):
    """Reads the current queue depth of the router."""

    def describe(self) -> str:
        """Where the number comes from, for logs and conditions."""
        ...

    def queue_depth(self) -> float:
        """Requests waiting now; raises MetricsUnavailableError."""
        ...

    def read(self) -> MetricsReading:
        """Queue depth and the arrivals counter; raises MetricsUnavailableError."""
        ...


class PrometheusQueueDepth:
    """A PromQL query through prometheus-api-client; the query must return one number.

    The queries give totals over every pod (``sum``); with ``pods`` (how many are ready now)
    the reading is per pod: both divided by it, as the planner's thresholds are per server.
    """

    def __init__(
        self,
        url: str,
        query: str | None = None,
        timeout_s: float = 2.0,
        arrivals_query: str | None = None,
        pods: Callable[[], int] | None = None,
    ) -> None:
        self.url = url
        self.pods = pods
        self.query = query or default_query()
        self.arrivals_query = arrivals_query
        self.timeout_s = timeout_s
        # No client-side retries: the caller polls every second and must hear of an outage
        # now, not after the default retry schedule.
        self.client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout_s
        )

    def describe(self) -> str:
        """Prometheus URL and query."""
        return f"Prometheus {self.url} query {self.query}"

    def queue_depth(self) -> float:
        """Evaluate the queue-depth query now."""
        return self._scalar(self.query)

    def read(self) -> MetricsReading:
        """Queue depth, and arrivals when an arrivals query is configured."""
        depth = self._scalar(self.query)
        arrivals = self._scalar(self.arrivals_query) if self.arrivals_query else None
        pods = max(self.pods(), 1) if self.pods is not None else 1
        return MetricsReading(depth / pods, None if arrivals is None else arrivals / pods, pods)

    def _scalar(self, query: str) -> float:
        """Evaluate a query that must return one number."""
        try:
            result = self.client.custom_query(
                query=query,
                params={"timeout": f"{round(self.timeout_s * 1000)}ms"},
                timeout=self.timeout_s,
            )
        except (PrometheusApiClientException, OSError, ValueError) as error:
            raise MetricsUnavailableError(f"{self._where(query)}: {error}") from error
        except Exception as error:  # requests' connection errors are not OSError subclasses
            raise MetricsUnavailableError(
                f"{self._where(query)}: {type(error).__name__}: {error}"
            ) from error
        if not result:
            raise MetricsUnavailableError(
                f"{self._where(query)}: no series (is Prometheus scraping Triton's metrics port, "
                f"and is the model name right?)"
            )
        if len(result) > 1:
            raise MetricsUnavailableError(
                f"{self._where(query)}: {len(result)} series; aggregate them, e.g. sum(...)"
            )
        value = float(result[0]["value"][1])
        if math.isnan(value):
            raise MetricsUnavailableError(f"{self._where(query)}: the query returned NaN")
        return value

    def _where(self, query: str) -> str:
        return f"Prometheus {self.url} query {query}"


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class TritonQueueDepth:
    """Triton's own /metrics, scraped directly: no Prometheus in between, no scrape delay."""

    def __init__(
        self,
        metrics_url: str,
        model: str = DEFAULT_ROUTER_MODEL,
        metric: str = "nv_inference_pending_request_count",
        timeout_s: float = 2.0,
    ) -> None:
        self.metrics_url = metrics_url
        self.model = model
        self.metric = metric
        self.timeout_s = timeout_s

    def describe(self) -> str:
        """Metrics URL and series."""
        return f"Triton metrics {self.metrics_url} {self.metric}{{model={self.model!r}}}"

    def queue_depth(self) -> float:
        """Scrape once; the router's pending requests summed over versions."""
        return self.read().queue_depth

    def read(self) -> MetricsReading:
        """Scrape once: pending requests, and arrivals = finished + pending."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError) as error:
            raise MetricsUnavailableError(f"{self.describe()}: {error}") from error
        totals: dict[str, float] = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if not match or dict(_LABEL.findall(match["labels"] or "")).get("model") != self.model:
                continue
            totals[match["name"]] = totals.get(match["name"], 0.0) + float(match["value"])
        if self.metric not in totals:
            raise MetricsUnavailableError(
                f"{self.describe()}: no such series (is the model loaded?)"
            )
        finished = [totals.get(f"nv_inference_request_{k}") for k in ("success", "failure")]
        # The one request in service counts in neither: the counter lags by at most one.
        arrivals = (
            None if None in finished else sum(f or 0.0 for f in finished) + totals[self.metric]
        )
        return MetricsReading(totals[self.metric], arrivals)


def source_for(
    kind: str,
    url: str,
    model: str = DEFAULT_ROUTER_MODEL,
    query: str | None = None,
    arrivals_query: str | None = None,
    pods: Callable[[], int] | None = None,
) -> QueueDepthSource:
    """The metrics source a policy names: ``prometheus`` (PromQL, totals divided among the
    ``pods``) or ``triton`` (one server's /metrics)."""
    if kind == "triton":
        return TritonQueueDepth(url, model=model)
    if kind == "prometheus":
        return PrometheusQueueDepth(
            url,
            query or default_query(model),
            arrivals_query=arrivals_query or default_arrivals_query(model),
            pods=pods,
        )
    raise ValueError(f"metrics type {kind!r}: use prometheus or triton")

"""Queue-depth sources behind one small protocol: Prometheus (PromQL) or Triton's /metrics."""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from typing import Protocol

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

DEFAULT_ROUTER = "router"


def default_query(model: str = DEFAULT_ROUTER) -> str:
    """PromQL for the router's queue: Triton's pending requests, summed over versions."""
    return f'sum(nv_inference_pending_request_count{{model="{model}"}})'


class MetricsUnavailableError(RuntimeError):
    """The queue depth could not be read; the message names the source and the cause."""


class QueueDepthSource(Protocol):
    """Reads the current queue depth of the router."""

    def describe(self) -> str:
        """Where the number comes from, for logs and conditions."""
        ...

    def queue_depth(self) -> float:
        """Requests waiting or in service now; raises MetricsUnavailableError."""
        ...


class PrometheusQueueDepth:
    """A PromQL query through prometheus-api-client; the query must return one number."""

    def __init__(self, url: str, query: str | None = None, timeout_s: float = 2.0) -> None:
        self.url = url
        self.query = query or default_query()
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
        """Evaluate the query now."""
        try:
            result = self.client.custom_query(
                query=self.query,
                params={"timeout": f"{round(self.timeout_s * 1000)}ms"},
                timeout=self.timeout_s,
            )
        except (PrometheusApiClientException, OSError, ValueError) as error:
            raise MetricsUnavailableError(f"{self.describe()}: {error}") from error
        except Exception as error:  # requests' connection errors are not OSError subclasses
            raise MetricsUnavailableError(
                f"{self.describe()}: {type(error).__name__}: {error}"
            ) from error
        if not result:
            raise MetricsUnavailableError(
                f"{self.describe()}: no series (is Prometheus scraping Triton's metrics port, "
                f"and is the model name right?)"
            )
        if len(result) > 1:
            raise MetricsUnavailableError(
                f"{self.describe()}: {len(result)} series; aggregate them, e.g. sum(...)"
            )
        value = float(result[0]["value"][1])
        if math.isnan(value):
            raise MetricsUnavailableError(f"{self.describe()}: the query returned NaN")
        return value


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class TritonQueueDepth:
    """Triton's own /metrics, scraped directly: no Prometheus in between, no scrape delay."""

    def __init__(
        self,
        metrics_url: str,
        model: str = DEFAULT_ROUTER,
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
        """Scrape once and sum the router's series over versions."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError) as error:
            raise MetricsUnavailableError(f"{self.describe()}: {error}") from error
        values = [
            float(match["value"])
            for line in text.splitlines()
            if (match := _SAMPLE.match(line)) and match["name"] == self.metric
            if dict(_LABEL.findall(match["labels"] or "")).get("model") == self.model
        ]
        if not values:
            raise MetricsUnavailableError(
                f"{self.describe()}: no such series (is the model loaded?)"
            )
        return sum(values)

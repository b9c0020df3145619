"""The client of the Compass router on Triton (gRPC). A switch is one request to its control model
(``<router>_control``), which replaces a state file every instance reads: ms, no reload."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.domain.evaluation import Config
from compass.domain.mix import quantize_weight
from compass.domain.space import config_key
from compass_rules.admission import LATE_MESSAGE as LATE_MESSAGE
from compass_rules.deadlines import DEADLINE_PARAMETER
from compass_rules.protocol import (
    COMPONENT_TIMES_KEY,
    COMPONENT_TIMES_PARAMETER,
    CONTROL_SUFFIX,
    OVERRIDE_PARAMETER,
)
from compass_rules.routing import MIX_PREFIX
from compass_rules.routing import routing_key as rules_routing_key

# Triton's parameter on a stream's last response (asked with enable_empty_final_response).
FINAL_RESPONSE_PARAMETER = "triton_final_response"
# gRPC's back-off grows to 120 s, on a connection channels share: a pod restarted at the same
# address would stay "unreachable" for minutes. Each client has its own, retried within 0.5 s.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.use_local_subchannel_pool", 1),
]


@dataclass(frozen=True)
class GrpcTls:
    """TLS to Triton's gRPC port: CA (None: system roots), client pair, name to verify."""

    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ValueError(
                "TLS: give both the client certificate and its key (mutual TLS), or neither"
            )

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel's credentials."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem,
            private_key=self.key_pem,
            certificate_chain=self.cert_pem,
        )

    def channel_args(self) -> list[tuple[str, Any]]:
        """The server name to verify, where it is not the address's host."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def routing_key(config: Config, blend: Config | None = None, weight: float = 0.0) -> str:
    """One string for what a router serves (the weight on the grid), as a router reports it."""
    mix = 0.0 if blend is None else quantize_weight(weight)
    if blend is None or mix == 0.0:
        return config_key(config)
    if mix == 1.0:
        return config_key(blend)
    return rules_routing_key(config_key(config), config_key(blend), mix)


def parse_routing_key(key: str) -> tuple[str, str | None, float]:
    """A routing key back to (configuration key, blend key or None, weight)."""
    if not key.startswith(MIX_PREFIX):
        return key, None, 0.0
    try:
        base, blend, weight = json.loads(key.removeprefix(MIX_PREFIX))
        return str(base), str(blend), float(weight)
    except (ValueError, TypeError) as error:
        raise RoutingError(f"unreadable routing {key!r}: {error}") from error


class RoutingError(RuntimeError):
    """Triton could not be reached or refused a switch; the message says which and why."""


@dataclass(frozen=True)
class RouterReply:
    """One answer of the router: the pipeline's result and the configuration that served it."""

    result: dict[str, Any]
    config: str
    latency_s: float
    # Each component model's wall time, ms (None: not asked, or the result is no JSON object).
    component_ms: dict[str, float] | None = None
    # A decoupled router's time to its first streamed response (None: none), and what streamed.
    first_response_s: float | None = None
    streamed: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class RouterState:
    """What a router serves, its tables' digest, whether it binds, its (instances, slots) gate."""

    routing: str
    tables: str | None = None
    binds: bool = True
    gate: tuple[int, int] | None = None


@dataclass(frozen=True)
class SwitchReport:
    """A switch that took effect (``changed`` False: the router already served it)."""

    config: str
    attempts: int
    seconds: float
    changed: bool = True


class TritonRouter:
    """The router model of one Triton server, over gRPC."""

    def __init__(
        self,
        url: str,
        model: str = DEFAULT_ROUTER_MODEL,
        timeout_s: float = 30.0,
        attempts: int = 4,
        backoff_s: float = 0.25,
        tls: GrpcTls | None = None,
    ) -> None:
        self.url = url
        self.model = model
        self.control_model = f"{model}{CONTROL_SUFFIX}"
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        # Status calls must answer fast: a blackholed address would hold the operator's timer.
        self.control_timeout_s = min(timeout_s, 5.0)
        self.tls = tls
        self.client = grpc_client(self.url, self.tls)
        # The admission and late-binding tables (None: off), sent with every switch (restarts).
        self.admission: Mapping[str, Any] | None = None
        self.binding: Mapping[str, Any] | None = None
        # Whether it is decoupled (None: not asked yet); a client per thread for streams.
        self._decoupled: bool | None = None
        self._streams = threading.local()

    def close(self) -> None:
        """Close the gRPC channel (and this thread's stream client, if any)."""
        self.client.close()
        stream_client = getattr(self._streams, "client", None)
        if stream_client is not None:
            stream_client.close()

    def _unreachable(self, error: Exception) -> RoutingError:
        return RoutingError(f"Triton at {self.url} ({self.model}): {_message(error)}")

    def infer(
        self,
        request: Mapping[str, Any],
        config: Config | None = None,
        timeout_s: float | None = None,
        deadline_ns: int | None = None,
        component_times: bool = False,
    ) -> RouterReply:
        """Send one request, ``config`` overriding the active configuration for it alone."""
        tensor = request_tensor(request)
        parameters: dict[str, Any] = {}
        if config:
            parameters[OVERRIDE_PARAMETER] = config_key(config)
        if deadline_ns is not None:
            parameters[DEADLINE_PARAMETER] = int(deadline_ns)
        if component_times:
            parameters[COMPONENT_TIMES_PARAMETER] = True
        started = time.perf_counter()
        first_s: float | None = None
        streamed: tuple[dict[str, Any], ...] = ()
        try:
            if self.decoupled():
                response, first_s, latency, streamed = self._stream(
                    tensor, parameters, timeout_s or self.timeout_s, started
                )
            else:
                response = self.client.infer(
                    self.model,
                    [tensor],
                    parameters=parameters or None,
                    client_timeout=timeout_s or self.timeout_s,
                )
                latency = time.perf_counter() - started
        except InferenceServerException as error:
            raise self._unreachable(error) from error
        result, served_by = read_reply(response)
        times = (
            result.pop(COMPONENT_TIMES_KEY, None)
            if component_times and isinstance(result, dict)
            else None
        )
        return RouterReply(
            result=result,
            config=served_by,
            latency_s=latency,
            component_ms=None if times is None else component_times_of(times, self.url),
            first_response_s=first_s,
            streamed=streamed,
        )

    def decoupled(self) -> bool:
        """Whether the router streams (its model config's decoupled transaction policy)."""
        if self._decoupled is None:
            policy = self.model_config().get("model_transaction_policy") or {}
            self._decoupled = bool(policy.get("decoupled"))
        return self._decoupled

    def _stream(
        self, tensor: Any, parameters: dict[str, Any], timeout_s: float, started: float
    ) -> tuple[Any, float | None, float, tuple[dict[str, Any], ...]]:
        """One streamed request: the final response, times to first and final, what streamed."""
        client = getattr(self._streams, "client", None)
        if client is None:
            client = self._streams.client = grpc_client(self.url, self.tls)
        replies: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
        client.start_stream(
            callback=lambda result, error: replies.put((result, error, time.perf_counter())),
            stream_timeout=timeout_s,
        )
        first_s: float | None = None
        streamed: list[dict[str, Any]] = []
        try:
            client.async_stream_infer(
                self.model,
                [tensor],
                parameters=parameters or None,
                enable_empty_final_response=True,
            )
            while True:
                try:
                    result, error, at = replies.get(timeout=timeout_s)
                except queue.Empty:
                    raise InferenceServerException(
                        f"no response in {timeout_s:g} s on the stream"
                    ) from None
                if error is not None:
                    raise error
                final = result.get_response().parameters.get(FINAL_RESPONSE_PARAMETER)
                if final is not None and final.bool_param:
                    # Timed at its arrival: closing the stream (below) can take a busy client
                    # hundreds of ms, which no request spent.
                    return result, first_s, at - started, tuple(streamed)
                body, _ = read_reply(result)
                streamed.append(body)
                if first_s is None:
                    first_s = at - started
        finally:
            client.stop_stream()

    def model_config(self) -> dict[str, Any]:
        """The router's model config (Triton's JSON form)."""
        try:
            reply = self.client.get_model_config(
                self.model, as_json=True, client_timeout=self.control_timeout_s
            )
        except InferenceServerException as error:
            raise self._unreachable(error) from error
        config: dict[str, Any] = reply["config"]
        return config

    def control(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One request to the control model: ``{"set": config}`` or ``{}`` (report only)."""
        try:
            response = self.client.infer(
                self.control_model,
                [request_tensor(body)],
                client_timeout=self.control_timeout_s,
            )
        except InferenceServerException as error:
            message = _message(error)
            if "unknown model" in message or "not found" in message:
                message += (
                    f" (the router's control model {self.control_model} must be in the model "
                    f"repository: see model-images/README.md)"
                )
            raise RoutingError(f"Triton at {self.url} ({self.control_model}): {message}") from error
        result, _ = read_reply(response)
        return result

    def active_config(self) -> str:
        """What the router serves now: the configuration's key, or a mix's routing key."""
        return self.serving().routing

    def serving(self) -> RouterState:
        """What the router serves now and the digest of the tables it holds."""
        reply = self.control({})
        active = reply.get("routing") or reply.get("active")
        if not active:
            raise RoutingError(
                f"Triton at {self.url}: {self.model} has not published its configuration yet "
                f"(is it loaded?)"
            )
        tables, gate = reply.get("tables"), reply.get("gate")
        return RouterState(
            str(active),
            tables if isinstance(tables, str) else None,
            binds="tables" in reply,
            gate=_gate(gate),
        )

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        """Make ``config`` active (``blend`` serving ``weight``); retries, verifies the result."""
        wanted = routing_key(config, blend, weight)
        body: dict[str, Any] = {"set": json.loads(config_key(config))}
        body["admission"] = None if self.admission is None else dict(self.admission)
        body["binding"] = None if self.binding is None else dict(self.binding)
        if blend is not None:
            body.update(blend=json.loads(config_key(blend)), weight=quantize_weight(weight))
        started = time.perf_counter()
        last: Exception | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                result = self.control(body)
                reported = result.get("routing") or result.get("active")
                if reported != wanted:
                    raise RoutingError(f"control model reports {reported}")
                changed = bool(result.get("changed"))
                return SwitchReport(wanted, attempt, time.perf_counter() - started, changed)
            except RoutingError as error:
                last = error
                if attempt < self.attempts:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
        assert last is not None
        raise RoutingError(
            f"switch of {self.model} at {self.url} to {wanted} failed after {self.attempts} "
            f"attempts: {_message(last)}"
        )


def _gate(reported: object) -> tuple[int, int] | None:
    """A router's reported gate as (instances, slots); None: none, or unreadable."""
    if not isinstance(reported, dict):
        return None
    instances, slots = reported.get("instances"), reported.get("slots")
    if isinstance(instances, int) and isinstance(slots, int) and min(instances, slots) >= 1:
        return instances, slots
    return None


def request_tensor(request: Mapping[str, Any]) -> grpcclient.InferInput:
    """The one input of the router and of its control model: the request as JSON."""
    tensor = grpcclient.InferInput("REQUEST", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(dict(request)).encode()], dtype=np.object_))
    return tensor


def grpc_client(url: str, tls: GrpcTls | None) -> grpcclient.InferenceServerClient:
    """A gRPC client of Triton on its own channel (CHANNEL_ARGS: no 4 MiB limit, quick retry)."""
    return grpcclient.InferenceServerClient(
        url,
        channel_args=CHANNEL_ARGS + ([] if tls is None else tls.channel_args()),
        creds=None if tls is None else tls.credentials(),
    )


def read_reply(response: Any) -> tuple[dict[str, Any], str]:
    """The router's outputs: the pipeline's result and the configuration that served it."""
    result: dict[str, Any] = json.loads(_text(response.as_numpy("RESULT")))
    return result, _text(response.as_numpy("CONFIG"))


def router_instances(config: Mapping[str, Any]) -> int:
    """How many requests a router serves at once: its instance groups' counts."""
    groups = config.get("instance_group") or []
    return max(1, sum(int(group.get("count") or 1) for group in groups))


def component_times_of(times: Any, url: str) -> dict[str, float]:
    """The router's component times as {model: ms}; RoutingError if they are not that."""
    if not isinstance(times, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in times.items()
    ):
        raise RoutingError(
            f"Triton at {url}: {COMPONENT_TIMES_KEY} is not {{model: ms}} ({str(times)[:80]}); "
            "is the router's model.py this operator's?"
        )
    return {k: float(v) for k, v in times.items()}


def _text(array: Any) -> str:
    value = np.asarray(array).reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _message(error: Exception) -> str:
    if isinstance(error, InferenceServerException):
        return str(error.message() or error)
    return str(error)

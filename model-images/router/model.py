"""Compass router (runs the workflow's ``pipeline.py``) or, by ``compass_role``, its control
model (switches it); a Triton Python backend. Parameters: docs/serving.md, "The router". The
compass_router and compass_rules packages are copied beside it into each version folder."""

import os
import sys

# The packages beside this file come first: Triton's stub may list this folder last, after a
# site-packages that holds the operator's own compass_rules.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path[:1] != [_HERE]:
    sys.path.insert(0, _HERE)
try:
    import compass_rules  # noqa: F401  (checked here: one clear error at model load)
except ImportError as error:
    raise ImportError(
        f"compass router: no compass_rules package beside {__file__}: copy operator/"
        f"compass_rules into {_HERE} (as compass_dev.local_triton.assemble_repository and the "
        "images' Dockerfiles do)"
    ) from error

import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402
from compass_router.binding import LazyConfig, staged, whole_stage  # noqa: E402
from compass_router.gate import Inflight  # noqa: E402
from compass_router.metrics import GateGauge, ServedCounters, StreamTimes  # noqa: E402
from compass_router.poller import (  # noqa: E402
    DEFAULT_METRICS_URL,
    DEFAULT_POLL_MS,
    METRICS_URL_ENV,
    METRICS_URL_PARAMETER,
    POLL_MS_PARAMETER,
    PendingPoller,
)
from compass_router.state import (  # noqa: E402
    ADMISSION_FILE,
    BINDING_FILE,
    GATE_FILE,
    INFLIGHT_FILE,
    TABLES_FILE,
    ActiveConfig,
    Admission,
    LateError,
    TableFile,
    blend_state,
    read_state,
    state_path,
    write_state,
)
from compass_router.stream import (  # noqa: E402
    DECOUPLED_PARAMETER,
    ResponseStream,
    bls_request,
    client_stream,
    decoupled_components,
    router_response,
    stream_call,
)

from compass_rules.admission import check_admission  # noqa: E402
from compass_rules.binding import at_concurrency, check_binding, waited_long  # noqa: E402
from compass_rules.deadlines import (  # noqa: E402
    DEADLINE_PARAMETER,
    arrival_ns,
    bounded_deadline,
    gate_deadline,
    parse_deadline,
)
from compass_rules.protocol import (  # noqa: E402
    ACTIVE_PARAMETER,
    COMPONENT_TIMES_KEY,
    COMPONENT_TIMES_PARAMETER,
    CONTROL_SUFFIX,
    OVERRIDE_PARAMETER,
    PIPELINE_SLOTS_PARAMETER,
    ROLE_PARAMETER,
)
from compass_rules.routing import config_key, routing_key, tables_digest  # noqa: E402

ROUTER_PARAMETER = "compass_router_model"


def _unavailable(message):
    """A retryable error (UNAVAILABLE where this Triton's Python backend has codes)."""
    code = getattr(pb_utils.TritonError, "UNAVAILABLE", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def _reply(result, key, times):
    """The pipeline's result (with component ``times`` where asked) and the serving key."""
    if times is not None and isinstance(result, dict):
        result = {**result, COMPONENT_TIMES_KEY: times}
    return router_response(result, key)


def _request_body(request):
    payload = pb_utils.get_input_tensor_by_name(request, "REQUEST").as_numpy().reshape(-1)[0]
    return json.loads(payload.decode("utf-8") if isinstance(payload, bytes) else payload)


def _read_json(path, kind):
    """A small state file's JSON value if it is a ``kind`` (None: absent, unreadable or other)."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, kind) else None


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _load_pipeline(version_dir):
    """The workflow's pipeline module from ``version_dir``, or None if there is none."""
    path = os.path.join(version_dir, "pipeline.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("compass_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _routing(state):
    """A routing state's key (compass_rules.routing.routing_key)."""
    return routing_key(state["config"], state.get("blend"), state.get("weight", 0.0))


def timed(run_call, times):
    """``run_call`` adding each component model's wall time (ms, queue wait too) to ``times``."""

    def timed_call(model, inputs, outputs):
        started = time.perf_counter()
        try:
            return run_call(model, inputs, outputs)
        finally:
            times[model] = times.get(model, 0.0) + (time.perf_counter() - started) * 1000

    return timed_call


class TritonPythonModel:
    """The router, or (``compass_role: control``) the model that switches it."""

    def initialize(self, args):
        """Read the role, the default configuration and the pipeline."""
        model_config = json.loads(args["model_config"])
        parameters = model_config.get("parameters", {})

        def parameter(key, default):
            return parameters.get(key, {}).get("string_value", default) or default

        self.role = parameter(ROLE_PARAMETER, "router")
        if self.role not in ("router", "control"):
            raise ValueError(f"{ROLE_PARAMETER} {self.role!r}: use router or control")
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        if self.role == "control":
            router = parameter(ROUTER_PARAMETER, args["model_name"].removesuffix(CONTROL_SUFFIX))
            self.state = state_path(router)
            self.admission_file = state_path(router, ADMISSION_FILE)
            self.binding_file = state_path(router, BINDING_FILE)
            self.tables_file = state_path(router, TABLES_FILE)
            self.gate_file = state_path(router, GATE_FILE)
            # The router's pipeline checks a configuration before it becomes active.
            repository = os.path.dirname(args["model_repository"].rstrip("/"))
            self.pipeline = _load_pipeline(os.path.join(repository, router, "1"))
            return
        self.pipeline = _load_pipeline(version_dir)
        if self.pipeline is None:
            raise ValueError(f"no pipeline.py in {version_dir}")
        # Whether it streams to its clients: model_transaction_policy { decoupled: true }.
        self.decoupled = decoupled_components(parameter(DECOUPLED_PARAMETER, ""))
        self.client_stream = client_stream(parameter(DECOUPLED_PARAMETER, ""))
        self.streaming = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.stream = None
        default = config_key(json.loads(parameter(ACTIVE_PARAMETER, "{}")))
        self._check(json.loads(default))
        name = self.model_name = args["model_name"]
        path = state_path(name)
        # The first router instance publishes the default, so the control model can report it.
        write_state(path, {"config": default}, exclusive=True)
        self.active = ActiveConfig(path, default)
        self.admission = Admission(state_path(name, ADMISSION_FILE))
        self.binding = TableFile(state_path(name, BINDING_FILE), check_binding)
        self.inflight_path = state_path(name, INFLIGHT_FILE)
        self.inflight = Inflight(self.inflight_path)
        # Triton's pending count, polled from the first bound request on ("off": never).
        self.metrics_url = parameter(
            METRICS_URL_PARAMETER, os.environ.get(METRICS_URL_ENV, DEFAULT_METRICS_URL)
        )
        poll_ms = float(parameter(POLL_MS_PARAMETER, str(DEFAULT_POLL_MS)))
        if not 0 < poll_ms < 60_000:
            raise ValueError(f"{POLL_MS_PARAMETER} {poll_ms!r}: give a period in ms, e.g. 25")
        self.poll_s = poll_ms / 1000
        self.poller = None
        instances = max(
            sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])),
            1,
        )
        # The gate: at most this many requests run the pipeline at once (None: no gate).
        slots = parameter(PIPELINE_SLOTS_PARAMETER, None)
        self.pipeline_slots = None
        if slots is not None:
            try:
                self.pipeline_slots = int(slots)
            except ValueError:
                self.pipeline_slots = 0
            if self.pipeline_slots < 1:
                raise ValueError(
                    f"{PIPELINE_SLOTS_PARAMETER} {slots!r}: give how many requests run the "
                    "pipeline at once, an integer >= 1 (e.g. 1, with more router instances)"
                )
        # How many requests the pod serves at once: what followers share (the gate's slots).
        self.servers = self.pipeline_slots or instances
        # What the control model reports of the gate (every instance writes the same).
        gate = {"instances": instances, "slots": self.pipeline_slots}
        if self.pipeline_slots is None:
            _remove(state_path(name, GATE_FILE))
        else:
            write_state(state_path(name, GATE_FILE), gate)
        instance_name = args.get("model_instance_name", str(self.inflight.slot))
        self.gate_gauge = GateGauge(name, instance_name) if self.pipeline_slots else None
        self.counters = ServedCounters(name, instance_name)
        self.stream_times = StreamTimes(name, instance_name) if self.streaming else None

    def _check(self, config):
        check = getattr(self.pipeline, "check_config", None)
        if check is not None and config:
            check(config)

    def execute(self, requests):
        """Answer each request (a bad one fails alone); a decoupled router on its own streams."""
        if self.role == "router" and self.streaming:
            for request in requests:
                self.stream = stream = ResponseStream(request)
                try:
                    response = self._answer(request)
                finally:
                    self.stream = None
                # A client gone mid-stream cannot be answered: the next request still is.
                with contextlib.suppress(Exception):
                    stream.close(response)
                self.stream_times.streamed(stream.first_s, time.perf_counter() - stream.started)
            return None
        return [self._answer(request) for request in requests]

    def _answer(self, request):
        """One request's response (its error one too); what it served is counted."""
        # Counted here, after the gate's slot is given back: it never lengthens the pipeline's turn.
        self.served_key = None
        try:
            serve = self._control if self.role == "control" else self._serve
            response = serve(request)
        except LateError as error:
            self.counters.refused_one()
            response = pb_utils.InferenceResponse(error=_unavailable(str(error)))
        except Exception as error:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))
        if self.served_key is not None:
            self.counters.served_one(self.served_key)
        return response

    def _call(self, model, inputs, outputs):
        """Call a component: a decoupled one as a stream (the last one's forwarded to a client)."""
        if model in self.decoupled:
            forwards = self.stream is not None and model == self.client_stream
            forward = self.stream.forward if forwards else None
            return stream_call(model, inputs, outputs, forward)
        response = bls_request(model, inputs, outputs).exec()
        if response.has_error():
            message = response.error().message()
            if "decoupled" in message:
                # A streaming component the router was not told of: say where to tell it.
                message += f" (name {model} in the router's {DECOUPLED_PARAMETER} parameter)"
            raise RuntimeError(f"{model}: {message}")
        tensors = {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}
        return {name: tensor.as_numpy() for name, tensor in tensors.items()}

    def _serve(self, request):
        body = _request_body(request)
        parameters = json.loads(request.parameters() or "{}")
        table = self.binding.current()
        deadline = parameters.get(DEADLINE_PARAMETER)
        deadline = None if deadline is None else parse_deadline(deadline)
        taken_up = time.time_ns()
        override = parameters.get(OVERRIDE_PARAMETER)
        slo_ms = self._slo_ms(table)
        if deadline is not None:
            # Bounded to a few SLOs around its take-up: it feeds what every client shares.
            deadline = bounded_deadline(deadline, taken_up, slo_ms)
        elif self.pipeline_slots and not override and slo_ms is not None:
            # Behind the gate a request is taken up as it arrives: take-up plus SLO is its deadline.
            deadline = taken_up + int(slo_ms * 1e6)
        # Every take-up counts towards the pod's rate, at its arrival where the deadline tells it.
        arrived = None
        if table is not None and table["slo_ms"] is not None and deadline is not None:
            arrived = arrival_ns(deadline, taken_up, table["slo_ms"])
        qps = self.inflight.dispatched(arrived)
        binds = table is not None and deadline is not None and not override
        # The lag cap's schedule: static fastest's start of each request, in take-up order.
        schedule = None
        if binds and table["lag_share"] is not None:
            # Static fastest keeps every slot busy: the fastest's likely time at that many.
            fastest_ns = at_concurrency(table, self.servers)["arrays"]["fastest_ms"][1] * 1e6
            schedule = (taken_up if arrived is None else arrived, fastest_ns, self.servers)
        if not self.pipeline_slots:
            static_start = None if schedule is None else self.inflight.static_start(*schedule)
            key = self.active.current()
            return self._run(
                body, key, parameters, table, deadline, arrived, qps, taken_up, static_start
            )
        # The gate: it waits its turn in the shared table, seen with its deadline by those ahead.
        _, static_start = self.inflight.queue_at_gate(gate_deadline(deadline, taken_up), schedule)
        try:
            # The gauge only for a waiter: each set is a server call (2.9 ms p99 on 2 cores).
            if not self.inflight.enter_if_free(self.pipeline_slots):
                self.gate_gauge.waiting(1)
                try:
                    self.inflight.pass_gate(self.pipeline_slots)
                finally:
                    self.gate_gauge.waiting(0)
            elif binds and table["settle_ms"]:
                # The burst it may lead reaches the gate over a few ms: it binds seeing them.
                time.sleep(table["settle_ms"] / 1000)
            # What the workflow serves now: a switch while it waited applies to it, as it does
            # to a request still queued in Triton (and in the simulator).
            key = self.active.current()
            return self._run(
                body, key, parameters, table, deadline, arrived, qps, time.time_ns(), static_start
            )
        finally:
            self.inflight.leave_gate()

    def _slo_ms(self, binding):
        """The SLO a table in force carries (late binding's, else admission's), or None."""
        if binding is not None and binding["slo_ms"] is not None:
            return binding["slo_ms"]
        admission = self.admission.current()
        return None if admission is None else admission["slo_ms"]

    def _run(self, body, key, parameters, table, deadline, arrived, qps, started, static_start):
        """Run the pipeline for a request that started at ``started`` (ns since the epoch)."""
        override = parameters.get(OVERRIDE_PARAMETER)
        times = {} if parameters.get(COMPONENT_TIMES_PARAMETER) else None
        if override:
            key = config_key(json.loads(override) if isinstance(override, str) else override)
        elif deadline is not None:
            if table is not None:
                degrade_after = table["degrade_after"]
                hurried = (
                    arrived is not None
                    and degrade_after is not None
                    and waited_long((started - arrived) / 1e6, table["slo_ms"], degrade_after)
                )
                return self._serve_bound(body, table, deadline, qps, hurried, times, static_start)
            key = self.admission.judge(key, deadline)
        # The pipeline gets the canonical form too: its components may key data by it.
        config = json.loads(key)
        if not config:
            raise ValueError(
                f"no configuration: set the router's {ACTIVE_PARAMETER} parameter or the "
                f"request parameter {OVERRIDE_PARAMETER}"
            )
        result = self.pipeline.run(
            body, config, self._call if times is None else timed(self._call, times)
        )
        if not override:
            self.served_key = key
        return _reply(result, key, times)

    def _serve_bound(self, body, table, deadline_ns, qps, hurried, times, static_start):
        """Serve a request with a lazily bound configuration (late binding)."""
        followers = 0
        # Behind a gate its waiters are the followers; polling there changed no decision and cost
        # ~4 ms a turn (docs/method.md, "The router's poller").
        if self.metrics_url != "off" and not self.pipeline_slots:
            if self.poller is None:
                self.poller = PendingPoller(
                    self.metrics_url,
                    self.model_name,
                    self.poll_s,
                    self.inflight.taken,
                    board=self.inflight,
                    lock_path=self.inflight_path + ".poller",
                )
            followers = self.poller.followers()
        config = LazyConfig(
            table,
            deadline_ns,
            self.inflight,
            qps,
            hurried,
            followers,
            self.servers,
            gated=self.pipeline_slots is not None,
            static_start_ns=static_start,
        )
        run_call = staged(self._call, config, self.inflight)
        if times is not None:
            run_call = timed(run_call, times)
        with whole_stage(config, self.inflight):
            result = self.pipeline.run(body, config, run_call)
        self.served_key = config.key()
        return _reply(result, self.served_key, times)

    def _control(self, request):
        """``{"set": config}`` (with ``"blend"`` and ``"weight"``) switches; ``{}`` reports."""
        body = _request_body(request)
        # Checked before anything is written: a bad table changes nothing.
        table = body.get("admission")
        table = None if table is None else check_admission(table)
        binding = body.get("binding")
        if binding is not None:
            check_binding(binding)
        try:
            previous = read_state(self.state)
        except FileNotFoundError:
            previous = None  # the router has not published its default yet
        active = previous
        if "set" in body:
            wanted = blend_state(config_key(body["set"]), body.get("blend"), body.get("weight"))
            for key in (wanted["config"], wanted.get("blend")):
                if key:
                    self._check(json.loads(key))
            if wanted != previous:
                write_state(self.state, wanted)
            active = wanted
        if "admission" in body:
            self._set_table(self.admission_file, table, check_admission)
        if "binding" in body:
            self._set_table(self.binding_file, binding)
        tables = self._set_digest(body)
        routing = None if active is None else _routing(active)
        result = {
            "active": None if active is None else active["config"],
            "blend": None if active is None else active.get("blend"),
            "weight": 0.0 if active is None else active.get("weight", 0.0),
            "routing": routing,
            "previous": None if previous is None else _routing(previous),
            "changed": active != previous,
            # The operator skips a switch that changes neither routing nor tables (None: send).
            "tables": tables,
            # Behind a gate every request is bound, without one only those with a deadline.
            "gate": _read_json(self.gate_file, dict),
        }
        return router_response(result, routing or "")

    def _set_digest(self, body):
        """The digest of the tables held: set from a body carrying both, else as last set."""
        if "admission" in body and "binding" in body:
            digest = tables_digest(body["admission"], body["binding"])
            with contextlib.suppress(OSError):
                if _read_json(self.tables_file, str) != digest:
                    write_state(self.tables_file, digest)
            return digest
        if "admission" in body or "binding" in body:
            # One table changed without the other: what is held is no longer known.
            _remove(self.tables_file)
            return None
        return _read_json(self.tables_file, str)

    def _set_table(self, path, table, held=lambda table: table):
        """Write a checked table (None: remove it) unless ``path`` holds it: routers reread it."""
        if table is None:
            _remove(path)
            return
        current = _read_json(path, dict)
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if current is not None and held(current) == table:
                return
        write_state(path, table)

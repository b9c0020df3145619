"""Compass router and its control model (Triton Python backend, BLS).

One generic file for every workflow, in two roles chosen by the model config parameter
``compass_role``:

- ``router`` (the default): runs the workflow's ``pipeline.py`` (next to this file:
  ``run(request, config, call) -> dict`` where ``call(model, inputs, outputs)`` runs a component
  model through BLS) with the active configuration. A request parameter ``compass_config``
  (JSON) overrides it for that request only: that is how search and profiling evaluate a
  configuration without moving production traffic.
- ``control``: a small model beside the router (``<router>_control``) that sets and reports the
  router's active configuration. A switch is one inference request to it: no reload, no new
  process, and it does not queue behind the router's requests (its own model, its own queue).

Why a state file: the router's instances and the control model are separate stub processes of
one tritonserver, and a file replaced atomically (write, then rename) is the cheapest state they
can share. The router stats it before each request (about a microsecond) and rereads it only
when it changed, so every request that starts after a switch returned is served by the new
configuration, in every router instance. The file is keyed by the tritonserver (the stubs'
parent: its PID and start time), so a restarted server starts from its config's default, never
from a stale switch, and two servers on one host never share one. ``compass_active_config`` in the router's
config is that default.

The state may also name a ``blend`` and its ``weight`` (the split strategy: a share of the
requests served by the next more accurate configuration, in 5% steps). Each router instance
deals its requests by smooth weighted round-robin, not by a random draw: it is deterministic,
so every 20 consecutive requests of an instance hold the mix exactly, and the two
configurations interleave instead of running in blocks.

Admission at dispatch (optional): a switch may carry an ``admission`` table (each configuration's
service time at a quantile, in ms, and the fastest's key), kept in a second state file. A request
that carries its deadline (request parameter ``compass_deadline_ns``: ns since the epoch, set by
the client or gateway that owns the SLO) is judged when an instance takes it up, which is when
its wait is known: Triton queues a request before the router sees it. It is served as routed if
that configuration's time fits what is left of its deadline and at least ``degrade_below_ms``
is left (less means it waited long, so a queue stands behind it: the fastest shortens it),
else on the fastest if that fits, else refused with UNAVAILABLE ("compass admission: late
..."), so that it costs the requests behind it nothing; where the table says ``refuse: false``
(clients that cannot retry), served on the fastest instead, which holds them up the least.
Requests without a deadline (but behind the gate, below), and overrides, are served as before.

Component times (profiling): a request with the parameter ``compass_component_times`` set gets
each component model's wall time, in ms summed over its calls, in its result under
``compass_component_ms`` (a pipeline whose result is not a JSON object gets none).

Late binding (optional, issue 43): a switch may carry a ``binding`` table (the pipeline's stages,
each with the parameters it binds and the component model it calls, or the list of models it may
call, such as a retriever and a reranker, and the configurations allowed, each with its accuracy
and per-stage times: compass.domain.binding.router_table), kept in a third state file. A request
that carries its deadline then gets a lazy ``config``: a parameter is bound when ``pipeline.py``
first reads it (with every earlier stage not bound yet), to the most accurate allowed configuration
consistent with what is bound whose remaining time (each remaining component's work in flight, read
from a shared-memory table the router instances keep, plus its own per-stage times) fits what is
left of the deadline; else the fastest completion; refused (UNAVAILABLE) at the first stage where
the table refuses and even the fastest is more likely late than not.
compass.domain.binding.bind_stage is the same rule (tests/unit/test_router_binding.py holds them
together). A stage's in-flight work is what is left of its time after the request's calls there so
far; a parameter first read after the request called a component counts the stage called last as
done. Existing pipeline.py files run unchanged: one that reads every parameter up front binds them
all at dispatch.

The queue in front of the router (late binding): Triton queues requests before an instance
takes them up, where the in-flight table cannot see them. One daemon thread a pod (started
with the first bound request in each instance; the instance holding the pod's poller lock
polls, the others read its count from the shared table) reads Triton's
``nv_inference_pending_request_count`` for this model every ``compass_pending_poll_ms`` (model
config parameter, default 25) from ``compass_metrics_url`` (model config parameter, else the
environment's ``COMPASS_METRICS_URL``, else http://127.0.0.1:8002/metrics; ``off`` never
polls), never per request. A request taken up then has as followers the count at the last poll less the requests
the instances took up since, each taken as having as long left as itself, and spares them as
compass.domain.binding.follower_spare_ms does. Without a fresh count (no metrics port, an
error, a count older than 4 polls) it has none: the binding is today's. Behind a gate (below)
nothing is polled: the followers are the requests waiting at the gate.

The gate (optional, model config parameter ``compass_pipeline_slots``: G; absent, no gate):
the router runs N > G instances, which take requests up as they arrive (while fewer than N are
in the router), and at most G of them run the pipeline at once, in take-up order across the
instances' processes. A request taken up draws a ticket (a counter in the in-flight table's
shared file, under its file lock) and waits at the gate, its slot there saying "waiting" with
its deadline, looking again every 0.5 ms until fewer than G requests are in the pipeline or
waiting with an earlier ticket. So the queue the pod holds is in the table, not in Triton's:
a request that binds sees each request waiting behind it with what is left of its own deadline
(then, beyond them, the poller's count of those Triton still holds), and spares them as
follower_spare_ms does; the followers share the G slots, not the N instances. A request that
waited at the gate longer than the table's ``degrade_after`` binds the fastest completion, as
one that waited in Triton's queue does without the gate. A dead process never wedges the gate:
every 50 ms of waiting, the places ahead whose process is gone (or a zombie) are cleared, and a
restarted stub that takes a dead one's slot starts with it free. Behind the gate a request
without a deadline, where the binding table (else the admission table) has ``slo_ms``, gets
one: its take-up (its arrival, while fewer than N are in the router) plus ``slo_ms`` (client-free
binding and admission; overrides are served as asked). The gate empties Triton's queue of the router
(``nv_inference_pending_request_count``, the operator's queue signal): each instance exports 1
on the gauge ``compass_router_gate_waiting`` (labels model, instance) while its request waits at
the gate, and the operator adds the gauge to the pending count, so a strategy that watches the
queue sees the requests not yet in the pipeline, with the gate or without.

The lag cap (optional, the binding table's ``lag_share`` and ``lag_reserve``): the instances keep
the schedule static fastest would keep in the shared table (when its queue is next free, in ns;
each request bound draws its start there, max(its arrival, that), and moves it on by the
fastest's likely time over the pod's servers, under the file lock in take-up order, behind the
gate with its ticket), and a request's extra time over its fastest completion may leave it at
most ``lag_share`` x (``slo_ms`` - ``lag_reserve`` x the fastest's likely time) behind that
schedule (lag_spare_ms; compass.domain.bindingsim's rule). Absent: no cap.
"""

import contextlib
import fcntl
import http.client
import importlib.util
import json
import math
import mmap
import os
import struct
import tempfile
import threading
import time
import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils

ACTIVE_PARAMETER = "compass_active_config"
OVERRIDE_PARAMETER = "compass_config"
DEADLINE_PARAMETER = "compass_deadline_ns"
# A request that sets this (profiling does) gets each component model's wall time in its
# result, under COMPONENT_TIMES_KEY: {model: ms, summed over its calls}.
COMPONENT_TIMES_PARAMETER = "compass_component_times"
COMPONENT_TIMES_KEY = "compass_component_ms"
LATE_MESSAGE = "compass admission: late"
ROLE_PARAMETER = "compass_role"
ROUTER_PARAMETER = "compass_router_model"
# Where the state files live; default /dev/shm (memory), else the temporary directory.
STATE_DIR_ENV = "COMPASS_STATE_DIR"
# Blend weights are multiples of 1 / WEIGHT_STEPS (compass.domain.mix).
WEIGHT_STEPS = 20
# A mix's routing key: the prefix tells it from a configuration key (a JSON object).
MIX_PREFIX = "mix:"


def canonical(config):
    """Canonical JSON of a configuration, the same as compass.domain.space.config_key."""

    def plain(value):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return json.dumps({k: plain(v) for k, v in config.items()}, sort_keys=True)


def state_path(router_model):
    """The state file of this server's router ``router_model``."""
    directory = os.environ.get(STATE_DIR_ENV)
    if not directory:
        shm = "/dev/shm"
        directory = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    return os.path.join(directory, f"compass-{_server_identity()}-{router_model}.json")


def admission_path(router_model):
    """The admission table's file beside the routing state of ``router_model``."""
    return state_path(router_model).removesuffix(".json") + "-admission.json"


def _stamp(path):
    """What tells a replaced file from the last one read (None: there is none)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _server_identity():
    """The tritonserver (the stubs' parent) as PID and start time: unique across restarts.

    The PID alone is not: a restarted container's server often gets the same one, and /dev/shm
    outlives the container (it is the pod's).
    """
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/stat", encoding="ascii") as stat:
            # Field 22, counted after the command name (which may hold spaces).
            started = stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return str(parent)
    return f"{parent}-{started}"


def routing_key(state):
    """One string for a state: its configuration's key, or the mix with its blend and weight.

    The same as compass.dataplane.triton.routing_key.
    """
    if not state.get("blend"):
        return state["config"]
    return MIX_PREFIX + json.dumps([state["config"], state["blend"], state["weight"]])


def blend_state(config_key, blend, weight):
    """The state for a configuration with an optional blend; checks and normalises the weight."""
    if blend is None or weight in (None, 0, 0.0):
        return {"config": config_key}
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight != weight:
        raise ValueError(f"weight {weight!r} is not a number: give a share in [0, 1], e.g. 0.25")
    if not 0 <= weight <= 1 or weight in (float("inf"), float("-inf")):
        raise ValueError(f"weight {weight!r} is outside [0, 1]: give a share, e.g. 0.25")
    # Down to the grid, never more blend than asked (compass.domain.mix.quantize_weight).
    steps = int(weight * WEIGHT_STEPS + 1e-9)
    if steps == 0:
        return {"config": config_key}
    if steps == WEIGHT_STEPS:
        return {"config": canonical(blend)}
    return {"config": config_key, "blend": canonical(blend), "weight": steps / WEIGHT_STEPS}


class SmoothWeighting:
    """Smooth weighted round-robin (nginx's): deterministic and evenly interleaved."""

    def __init__(self, weights):
        self.weights = [(member, weight) for member, weight in weights if weight > 0]
        self.total = sum(weight for _, weight in self.weights)
        self.credit = [0] * len(self.weights)

    def pick(self):
        """The member that serves the next request."""
        for i, (_, weight) in enumerate(self.weights):
            self.credit[i] += weight
        best = max(range(len(self.weights)), key=lambda i: (self.credit[i], -i))
        self.credit[best] -= self.total
        return self.weights[best][0]


def write_state(path, state, exclusive=False):
    """Write the routing state atomically; ``exclusive``: only if there is none yet."""
    directory = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".compass-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(state, out)
        if exclusive:
            # Fails if the control model wrote first: then its switch stands.
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        else:
            os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def read_state(path):
    """The routing state in a state file (keys canonical); raises if absent or unreadable."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    state = {"config": canonical(json.loads(data["config"]))}
    if data.get("blend"):
        state.update(blend=canonical(json.loads(data["blend"])), weight=float(data["weight"]))
    return state


class ActiveConfig:
    """The routing as the state file says, reread only when the file changed."""

    def __init__(self, path, default_key):
        self.path = path
        self.state = {"config": default_key}
        self.dealer = None
        self.stamp = None

    def current(self):
        """Canonical key of the configuration that serves the next request."""
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self.stamp:
            try:
                state = read_state(self.path)
            except (OSError, ValueError, KeyError, TypeError):
                state = None  # mid-replace or damaged: keep the last good one, read again next time
            if state is not None:
                self.stamp = stamp
                if state != self.state:
                    self.state, self.dealer = state, None
        if not self.state.get("blend"):
            return self.state["config"]
        if self.dealer is None:
            blended = round(self.state["weight"] * WEIGHT_STEPS)
            self.dealer = SmoothWeighting(
                [(self.state["config"], WEIGHT_STEPS - blended), (self.state["blend"], blended)]
            )
        return self.dealer.pick()


class LateError(Exception):
    """A request that would miss its deadline whatever served it."""


def check_admission(table):
    """The admission table as a switch sends it, checked: quantiles (ms, >= 0) by key, the
    fastest's key among them, and whether late requests are refused (true when absent)."""
    if not isinstance(table, dict) or not isinstance(table.get("quantiles_ms"), dict):
        raise ValueError("admission: give {'quantiles_ms': {config: ms}, 'fastest': config}")
    quantiles = {}
    for key, ms in table["quantiles_ms"].items():
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms < float("inf"):
            raise ValueError(f"admission: quantile {ms!r} of {key} is not a time in ms >= 0")
        quantiles[canonical(json.loads(key))] = float(ms)
    fastest = canonical(json.loads(table.get("fastest") or "null") or {})
    if fastest not in quantiles:
        raise ValueError("admission: fastest is not one of the quantiles' configurations")
    below = table.get("degrade_below_ms", 0.0)
    if (
        isinstance(below, bool)
        or not isinstance(below, (int, float))
        or not 0 <= below < float("inf")
    ):
        raise ValueError(f"admission: degrade_below_ms {below!r} is not a time in ms >= 0")
    refuse = table.get("refuse", True)
    if not isinstance(refuse, bool):
        raise ValueError(f"admission: refuse {refuse!r} is not true or false")
    slo_ms = table.get("slo_ms")
    if slo_ms is not None and (
        isinstance(slo_ms, bool)
        or not isinstance(slo_ms, (int, float))
        or not 0 < slo_ms < float("inf")
    ):
        raise ValueError(f"admission: slo_ms {slo_ms!r} is not a time in ms > 0")
    return {
        "quantiles_ms": quantiles,
        "fastest": fastest,
        "degrade_below_ms": float(below),
        "refuse": refuse,
        "slo_ms": None if slo_ms is None else float(slo_ms),
    }


class TableFile:
    """A table a switch sends (admission's, late binding's) as its file says, checked by
    ``check``, reread only when the file changed."""

    def __init__(self, path, check):
        self.path = path
        self.check = check
        self.table = None
        self.stamp = None

    def current(self):
        """The table, or None while there is none (that feature off)."""
        stamp = _stamp(self.path)
        if stamp is None:
            self.table, self.stamp = None, None
        elif stamp != self.stamp:
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self.table = self.check(json.load(handle))
                self.stamp = stamp
            except (OSError, ValueError, KeyError, TypeError):
                pass  # mid-replace or damaged: keep the last good one, read again next time
        return self.table


class Admission(TableFile):
    """The admission table (check_admission) and the judgement of a request by it."""

    def __init__(self, path):
        super().__init__(path, check_admission)

    def judge(self, key, deadline_ns):
        """The configuration that serves a request with this deadline now; LateError if none
        can make it and the table refuses such requests."""
        table = self.current()
        own = None if table is None else table["quantiles_ms"].get(key)
        if own is None:
            return key
        left_ms = (parse_deadline(deadline_ns) - time.time_ns()) / 1e6
        fastest = table["fastest"]
        if own <= left_ms and left_ms >= table["degrade_below_ms"]:
            return key
        if table["quantiles_ms"][fastest] <= left_ms:
            return fastest
        if own <= left_ms:
            return key
        if not table["refuse"]:
            return fastest
        raise LateError(
            f"{LATE_MESSAGE}: {max(left_ms, 0.0):.0f} ms of its deadline left, the fastest "
            f"configuration needs {table['quantiles_ms'][fastest]:.0f} ms; retry later"
        )


# Late binding's bounds (compass.domain.binding.MAX_BINDING_CONFIGS, MAX_STAGES) and the
# shared in-flight table: one slot per router instance (pid, stage, entered ns, predicted ms).
MAX_BINDING_CONFIGS = 128
MAX_BINDING_STAGES = 8
# The longest settle at a free pipeline a table may ask (compass.domain.binding.MAX_SETTLE_MS).
MAX_SETTLE_MS = 100.0
# compass.domain.binding.ROUNDING_MS: an exact tie with a deadline must not turn on rounding.
ROUNDING_MS = 1e-6
INFLIGHT_SLOTS = 64
_SLOT = struct.Struct("<qqqd")
# After the slots: the arrival times of the last requests taken up (ns since the epoch), a ring
# the instances share, for the arrival rate the slow loop's limits (max_qps) are judged on.
DISPATCH_RING = 1024
RATE_WINDOW_S = 2.0
_RING_AT = INFLIGHT_SLOTS * _SLOT.size
# After the ring: the gate (compass_pipeline_slots): the last ticket given and a count of the
# moves that may let a waiter pass (a request left, a dead one cleared), then per slot (the same
# slot as the in-flight table's) its owner's pid, its request's ticket, its state at the gate
# and its deadline (ns since the epoch; 0: none).
_GATE_AT = _RING_AT + (DISPATCH_RING + 1) * 8
_GATE_FIELDS = 4
GATE_FREE, GATE_WAITING, GATE_RUNNING = 0, 1, 2
# After the gate: the pod's last poll of Triton's pending count (PendingPoller): when (monotonic
# ns, which every process of the host shares; 0: none or failed), the count, and the take-ups
# counted by then.
_POLL_AT = _GATE_AT + (2 + INFLIGHT_SLOTS * _GATE_FIELDS) * 8
_POLL_FIELDS = 3
# After the poll: when static fastest's schedule next frees a server (ns since the epoch; 0:
# never yet), the lag cap's (Inflight.static_start).
_STATIC_AT = _POLL_AT + _POLL_FIELDS * 8


def binding_path(router_model):
    """The late-binding table's file beside the routing state of ``router_model``."""
    return state_path(router_model).removesuffix(".json") + "-binding.json"


def _share_of_slo(table, name, slo_ms):
    """The table's ``name``: a share of its ``slo_ms`` in (0, 1], or None where absent."""
    share = table.get(name)
    if share is not None and (
        isinstance(share, bool)
        or not isinstance(share, (int, float))
        or not 0 < share <= 1
        or slo_ms is None
    ):
        raise ValueError(f"binding: {name} {share!r} is not a share of slo_ms in (0, 1] (or null)")
    return share


def check_binding(table):
    """The binding table as a switch sends it, checked and made ready to decide on."""
    if not isinstance(table, dict):
        raise ValueError(
            "binding: give {'stages': [[param]], 'components': [model], 'configs': [...]}"
        )
    stages, components, configs = table.get("stages"), table.get("components"), table.get("configs")
    if not isinstance(stages, list) or not 1 <= len(stages) <= MAX_BINDING_STAGES:
        raise ValueError(f"binding: stages must be 1 to {MAX_BINDING_STAGES} lists of parameters")
    if not all(isinstance(s, list) and all(isinstance(n, str) for n in s) for s in stages):
        raise ValueError("binding: each stage is a list of parameter names")
    names = [n for s in stages for n in s]
    if len(set(names)) != len(names):
        raise ValueError("binding: a parameter is bound by two stages")
    if not isinstance(components, list) or len(components) != len(stages):
        raise ValueError("binding: components must name one model per stage")
    # A stage may call several models (a list): each call of one counts as that stage's.
    models = [[c] if isinstance(c, str) else c for c in components]
    if not all(
        isinstance(m, list) and m and all(isinstance(n, str) and n for n in m) for m in models
    ):
        raise ValueError("binding: each stage's component is a model name or a list of them")
    named = [n for m in models for n in m]
    if len(set(named)) != len(named):
        raise ValueError("binding: a component model belongs to two stages")
    if not isinstance(configs, list) or not 1 <= len(configs) <= MAX_BINDING_CONFIGS:
        raise ValueError(f"binding: configs must hold 1 to {MAX_BINDING_CONFIGS} configurations")
    checked = []
    for entry in configs:
        config = json.loads(canonical(json.loads(entry["config"])))
        if set(config) != set(names):
            raise ValueError(f"binding: {entry['config']} does not set exactly {sorted(names)}")
        times = {}
        for field in ("stage_ms", "stage_admit_ms"):
            values = entry.get(field, entry.get("stage_ms"))
            if (
                not isinstance(values, list)
                or len(values) != len(stages)
                or not all(
                    not isinstance(v, bool)
                    and isinstance(v, (int, float))
                    and 0 <= v < float("inf")
                    for v in values
                )
            ):
                raise ValueError(
                    f"binding: {field} of {entry['config']} is not one ms >= 0 per stage"
                )
            times[field] = [float(v) for v in values]
        accuracy = entry.get("accuracy")
        if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)):
            raise ValueError(f"binding: accuracy of {entry['config']} is not a number")
        limit = entry.get("max_qps")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0
        ):
            raise ValueError(f"binding: max_qps of {entry['config']} is not a rate >= 0 (or null)")
        checked.append(
            (
                config,
                float(accuracy),
                times["stage_ms"],
                times["stage_admit_ms"],
                None if limit is None else float(limit),
            )
        )
    refuse = table.get("refuse", False)
    if not isinstance(refuse, bool):
        raise ValueError(f"binding: refuse {refuse!r} is not true or false")
    slo_ms = table.get("slo_ms")
    if slo_ms is not None and (
        isinstance(slo_ms, bool) or not isinstance(slo_ms, (int, float)) or not 0 < slo_ms < 1e12
    ):
        raise ValueError(f"binding: slo_ms {slo_ms!r} is not a time in ms > 0 (or null)")
    degrade_after = _share_of_slo(table, "degrade_after", slo_ms)
    lag_share = _share_of_slo(table, "lag_share", slo_ms)
    lag_reserve = table.get("lag_reserve", 0)
    if isinstance(lag_reserve, bool) or not isinstance(lag_reserve, int) or lag_reserve < 0:
        raise ValueError(f"binding: lag_reserve {lag_reserve!r} is not a count >= 0")
    settle_ms = table.get("settle_ms", 0.0)
    if (
        isinstance(settle_ms, bool)
        or not isinstance(settle_ms, (int, float))
        or not 0 <= settle_ms <= MAX_SETTLE_MS
    ):
        raise ValueError(
            f"binding: settle_ms {settle_ms!r} is not a time in [0, {MAX_SETTLE_MS}] ms"
        )
    # The same numbers as arrays, for the followers' spare (computed at every stage bound).
    stage_ms = np.array([entry[2] for entry in checked])
    admit_ms = np.array([entry[3] for entry in checked])
    fastest = int(np.argmin([sum(entry[2]) for entry in checked]))
    arrays = {
        "stage_ms": stage_ms,
        "admit_ms": admit_ms,
        "values": {n: np.array([entry[0][n] for entry in checked], dtype=object) for n in names},
        "fastest_ms": (sum(checked[fastest][2]), sum(checked[fastest][3])),
        "fastest": fastest,
        "total_ms": stage_ms.sum(axis=1),
        "accuracy": np.array([entry[1] for entry in checked]),
    }
    return {
        "stages": [list(s) for s in stages],
        "components": components,
        "stage_of_model": {n: i for i, m in enumerate(models) for n in m},
        "configs": checked,
        "arrays": arrays,
        "refuse": refuse,
        "slo_ms": None if slo_ms is None else float(slo_ms),
        "degrade_after": None if degrade_after is None else float(degrade_after),
        "lag_share": None if lag_share is None else float(lag_share),
        "lag_reserve": lag_reserve,
        "settle_ms": float(settle_ms),
        "stage_of": {n: i for i, s in enumerate(stages) for n in s},
    }


def allowed_at(table, qps):
    """The configurations whose rate limit the pod's arrival rate is within."""
    return {i for i, entry in enumerate(table["configs"]) if entry[4] is None or qps <= entry[4]}


# The pending-count poller (late binding's view of the queue in front of the router): Triton's
# Prometheus metrics, read by one daemon thread per router instance, never per request.
METRICS_URL_PARAMETER = "compass_metrics_url"
METRICS_URL_ENV = "COMPASS_METRICS_URL"
DEFAULT_METRICS_URL = "http://127.0.0.1:8002/metrics"
POLL_MS_PARAMETER = "compass_pending_poll_ms"
DEFAULT_POLL_MS = 25.0
PENDING_METRIC = "nv_inference_pending_request_count"
# A count older than this many poll periods is not used (the poller is failing or stalled).
STALE_POLLS = 4
# After a failed poll (the metrics port absent or down) the poller waits this long.
POLL_RETRY_S = 1.0
# With nothing taken up for IDLE_AFTER_S, the poller looks only every IDLE_POLL_S: an idle
# pod's router does not read Triton's metrics page 40 times a second (the first request of a
# burst then binds as without a count, its count being stale).
IDLE_AFTER_S = 5.0
IDLE_POLL_S = 1.0
# An instance whose pod has a poller tries this often to become it (the poller gone).
LEADER_RETRY_S = 1.0


def parse_pending(text, model):
    """The requests waiting in Triton's queue for ``model`` (summed over its versions) in a
    Prometheus metrics page, or None where the page has no such sample."""
    label = f'model="{model}"'
    found = None
    for line in text.splitlines():
        if not line.startswith(PENDING_METRIC + "{"):
            continue
        labels, _, value = line[len(PENDING_METRIC) + 1 :].partition("}")
        if label not in labels.split(","):
            continue
        try:
            count = float(value.split()[0])
        except (IndexError, ValueError):
            continue
        found = (found or 0) + int(count)
    return found


class _LocalPoll:
    """A poller's last poll kept in its own process (no shared table)."""

    def __init__(self):
        self.last = None

    def publish_poll(self, polled_ns, count, taken):
        """Keep the poll (None count: none fresh)."""
        self.last = None if count is None else (polled_ns, count, taken)

    def last_poll(self):
        """The last poll, or None."""
        return self.last


class PendingPoller:
    """Polls Triton's pending count for the router model every ``period_s`` in a daemon
    thread; ``followers`` is how many requests wait behind one being taken up now: the count
    at the last poll less the requests taken up since (the instances' shared take-up counter,
    Inflight.taken). Without a fresh count (no metrics port, an error) it is 0: today's view.

    One poll a pod, not one per instance: every instance's thread waits for the pod's poller
    lock (``lock_path``; None: poll regardless), the one holding it polls and writes the count
    to ``board`` (the instances' shared table, Inflight), and every instance reads it there.
    Eight instances each fetching Triton's metrics page 40 times a second took enough CPU to
    slow the pod they watched (bench/serving_triton.py behind the gate, 2 cores). The lock is
    the kernel's (flock): a poller that dies frees it, and another instance takes over within
    LEADER_RETRY_S."""

    def __init__(self, url, model, period_s, taken, board=None, lock_path=None):
        self.url, self.model, self.period_s, self.taken = url, model, period_s, taken
        self.board = _LocalPoll() if board is None else board
        self.lock_path = lock_path
        self.thread = threading.Thread(target=self._run, name="compass-pending", daemon=True)
        self.thread.start()

    def poll(self):
        """One poll: the count, or None where the page cannot be read or lacks it."""
        taken = self.taken()
        polled = time.monotonic_ns()
        try:
            with urllib.request.urlopen(self.url, timeout=max(self.period_s * 4, 0.1)) as page:
                count = parse_pending(page.read().decode("utf-8", "replace"), self.model)
        except (OSError, ValueError, http.client.HTTPException):
            count = None
        self.board.publish_poll(polled, count, taken)
        return count

    def _lead(self):
        """Wait until this process holds the pod's poller lock (kept until it exits)."""
        if self.lock_path is None:
            return
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(LEADER_RETRY_S)

    def _run(self):
        self._lead()
        seen, busy_at = self.taken(), time.monotonic()
        while True:
            started = time.monotonic()
            wait = self.period_s if self.poll() is not None else POLL_RETRY_S
            if self.taken() != seen:
                seen, busy_at = self.taken(), started
            elif started - busy_at > IDLE_AFTER_S:
                wait = max(wait, IDLE_POLL_S)
            time.sleep(max(wait - (time.monotonic() - started), 0.001))

    def followers(self):
        """Requests waiting behind the one being taken up now (0 without a fresh count)."""
        last = self.board.last_poll()
        if last is None or time.monotonic_ns() - last[0] > STALE_POLLS * self.period_s * 1e9:
            return 0
        _, count, taken = last
        return max(count - (self.taken() - taken), 0)


def follower_slacks_ms(own_fastest_ms, followers_left_ms, follower_ms, servers=1, likely=None):
    """How much longer than its fastest completion a request may take without making each
    request waiting behind it late (None: one that does not count; compass.domain.binding.
    follower_slacks_ms)."""
    own_likely, follower_likely = likely or (own_fastest_ms, follower_ms)
    slacks = []
    ahead, ahead_likely = own_fastest_ms, own_likely
    for left in followers_left_ms:
        if left + ROUNDING_MS >= ahead_likely / servers + follower_likely:
            slacks.append(max(left - (ahead / servers + follower_ms), 0.0) * servers)
        else:
            slacks.append(None)
        ahead += follower_ms
        ahead_likely += follower_likely
    return slacks


def slacks_behind_ms(table, bound, at, backlog_ms, followers_left_ms, servers, known=None):
    """The slacks of the requests behind a request (follower_slacks_ms), each with what is
    left of its deadline (``followers_left_ms``, in FIFO order): behind a gate, those waiting
    at it, seen; without one, the poller's count, each taken as having the request's own
    time left (compass.domain.binding.polled_followers_left_ms)."""
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


# The joint plan's grid and a step's cost (compass.domain.binding.JOINT_STEP_MS, JOINT_STEPS,
# JOINT_STEP_COST).
JOINT_STEP_MS = 1.0
JOINT_STEPS = 128
JOINT_STEP_COST = 1e-7


def joint_options(table, bound, at, left_ms, backlog_ms, allowed=None, known=None):
    """The request's choices and a follower's, as (extra ms, accuracy) rows, for
    joint_spare_ms (compass.domain.binding.joint_options), on the table's arrays."""
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


def joint_spare_ms(own_options, follower_options, slacks_ms, servers=1, budget_ms=float("inf")):
    """How much longer than its fastest completion a request may take in the best plan for it
    and its followers together: every counted follower in time, the extra time in all within
    ``budget_ms``, the most accuracy in all (compass.domain.binding.joint_spare_ms, step for
    step: tests/unit/test_router_binding.py holds them together)."""
    counted = [s for s in slacks_ms if s is not None]
    if not counted:
        return float("inf")
    if not len(own_options):
        # Nothing fits its deadline: its fastest completion, whatever the plan.
        return 0.0
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
    # the arrivals to come): a step's cost far below any accuracy a choice adds.
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


def consistent_remaining_ms(table, bound, at, backlog_ms, times="stage_ms", known=None):
    """Which configurations agree with ``bound``, and each one's remaining time from stage
    ``at`` (at each remaining component, the work ahead plus its own time; summed in the
    order compass.domain.binding.remaining_ms sums), on the table's ``times`` (``stage_ms``
    or, likely, ``admit_ms``) arrays: a request reads these at every stage it binds, and the
    decision must stay well under a ms. ``known``: a dict that keeps them for one decision
    (the same request, stage and backlog), so the rules it applies read them once; neither
    array is to be changed."""
    if known is not None and times in known:
        return known[times]
    arrays = table["arrays"]
    consistent = np.ones(len(table["configs"]), dtype=bool)
    for name, value in bound.items():
        consistent &= arrays["values"][name] == value
    matrix = arrays[times]
    total = np.zeros(len(matrix))
    for stage in range(at, matrix.shape[1]):
        total = total + (backlog_ms[stage] + matrix[:, stage])
    if known is not None:
        known[times] = consistent, total
    return consistent, total


def quickest_remaining_ms(table, bound, at, backlog_ms, times="stage_ms", known=None):
    """The quickest remaining time from stage ``at`` among the configurations consistent with
    ``bound`` (all where none is)."""
    consistent, total = consistent_remaining_ms(table, bound, at, backlog_ms, times, known)
    return float(total[consistent].min() if consistent.any() else total.min())


def lag_spare_ms(table, bound, at, backlog_ms, now_ns, static_start_ns, known=None):
    """How much longer than its fastest completion a request may take so that it ends at most
    the table's lag cap behind the schedule static fastest keeps, where it would start at
    ``static_start_ns`` (Inflight.static_start): compass.domain.binding.lag_spare_ms on
    bindingsim's quantities (its quickest likely completion from stage ``at`` among the
    configurations consistent with ``bound``; the fastest's likely time)."""
    share = table["lag_share"]
    if share is None or static_start_ns is None:
        return float("inf")
    quickest_likely = quickest_remaining_ms(table, bound, at, backlog_ms, "admit_ms", known)
    fastest_likely_ms = table["arrays"]["fastest_ms"][1]
    cap_ms = share * max(table["slo_ms"] - table["lag_reserve"] * fastest_likely_ms, 0.0)
    behind_ms = (now_ns - static_start_ns) / 1e6 + quickest_likely - fastest_likely_ms
    return max(cap_ms - behind_ms, 0.0)


def bind_stage(
    table,
    stage,
    bound,
    left_ms,
    backlog_ms,
    allowed=None,
    at=None,
    hurried=False,
    spare_ms=float("inf"),
    known=None,
):
    """The configuration (index) a request heads for at ``stage``; LateError where the table
    refuses and even the fastest is more likely late than not (compass.domain.binding.
    bind_stage with no followers; ``allowed``: the configurations the rate allows, None all,
    the fastest completion the fallback whatever it allows; ``at``: the stage the request has
    reached, None ``stage``: a pipeline that reads a later stage's parameters first still
    has the stages from ``at`` to serve; ``hurried``: it waited long, so no more than the
    fastest completion, the domain's ``spare_ms`` 0; ``spare_ms``: how much longer than the
    fastest completion it may take, for the requests waiting behind it; ``known``:
    consistent_remaining_ms' memo for this decision)."""
    at = stage if at is None else at
    consistent, times = consistent_remaining_ms(table, bound, at, backlog_ms, known=known)
    if not consistent.any():
        raise ValueError(f"binding: no allowed configuration has {bound}")
    accuracy = table["arrays"]["accuracy"]
    candidates = np.flatnonzero(consistent)
    # Fastest completion; among equals the most accurate (the first such, as min() takes).
    fastest = int(candidates[np.lexsort((-accuracy[candidates], times[candidates]))[0]])
    fitting = consistent & (times <= left_ms) & (times - times[fastest] <= max(spare_ms, 0.0))
    if allowed is not None:
        permitted = np.zeros(len(times), dtype=bool)
        permitted[list(allowed)] = True
        permitted[fastest] = True
        fitting &= permitted
    if hurried:
        fitting &= times <= times[fastest]
    if fitting.any():
        # Most accurate; among equals the fastest (the first such, as max() takes).
        chosen = np.flatnonzero(fitting)
        return int(chosen[np.lexsort((times[chosen], -accuracy[chosen]))[0]])
    if table["refuse"] and stage == 0:
        _, admit = consistent_remaining_ms(table, bound, at, backlog_ms, "admit_ms", known)
        likely = float(admit[consistent].min())
        if likely > left_ms:
            raise LateError(
                f"{LATE_MESSAGE}: {max(left_ms, 0.0):.0f} ms of its deadline left, the fastest "
                f"completion needs {likely:.0f} ms; retry later"
            )
    return fastest


# The gate: a request next in line looks again every GATE_POLL_S (GATE_FAR_POLLS times less
# often further back), and every GATE_CHECK_S whether the processes ahead of it are still there.
PIPELINE_SLOTS_PARAMETER = "compass_pipeline_slots"
# Behind the gate Triton's pending count of the router stays near 0 (the instances take every
# request up): each instance exports 1 on this gauge while its request waits at the gate, so the
# operator's queue reading (compass.dataplane.metrics.GATE_WAITING_METRIC) adds them back.
GATE_WAITING_METRIC = "compass_router_gate_waiting"
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


def _metric(name, description, kind, labels):
    """A Triton custom metric's family and its series with these labels (None: the family
    alone), or (None, None) on a Triton without custom metrics or where they cannot be made:
    the router serves all the same, unmeasured. Keep the family with its series: Triton
    refuses a metric whose family was collected before it."""
    family_type = getattr(pb_utils, "MetricFamily", None)
    if family_type is None:
        return None, None
    try:
        family = family_type(name=name, description=description, kind=getattr(family_type, kind))
        return family, None if labels is None else family.Metric(labels=labels)
    except Exception:
        return None, None


class GateGauge:
    """This instance's place on the GATE_WAITING_METRIC gauge: 1 while its request waits at the
    gate, else 0 (a no-op on a Triton without custom metrics: the queue reading then misses
    the waiters, as it did before the gauge)."""

    def __init__(self, model, instance):
        # Labelled by Triton's instance name, which a restarted stub keeps: it takes the series
        # over and zeroes it, so a killed waiter leaves no phantom 1 behind.
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
        if self.metric is None:
            return
        with contextlib.suppress(Exception):
            self.metric.set(count)


# What the routers served (the operator's status.served and dashboards): each instance counts
# the requests it answered by the configuration's canonical key (overrides, search and
# profiling's, left out), and those it refused as late. A key past SERVED_MAX_KEYS an instance
# counts under "other" (a binding table holds at most 128 configurations): the series never
# grow without bound.
SERVED_METRIC = "compass_router_served_total"
REFUSED_METRIC = "compass_router_refused_total"
SERVED_MAX_KEYS = 160
SERVED_OTHER = "other"


class ServedCounters:
    """This instance's SERVED_METRIC (by configuration) and REFUSED_METRIC counters (a no-op on
    a Triton without custom metrics; a failed count never fails a request)."""

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
            metric = self.served.get(key)
            if metric is None:
                if len(self.served) >= SERVED_MAX_KEYS:
                    key = SERVED_OTHER
                metric = self.served.get(key)
                if metric is None:
                    metric = self.family.Metric(labels={**self.labels, "config": key})
                    self.served[key] = metric
            metric.increment(1)

    def refused_one(self):
        """Count one request refused as late."""
        if self.refused is not None:
            with contextlib.suppress(Exception):
                self.refused.increment(1)


class Inflight:
    """The router instances' shared table of what each is doing: which stage its request is
    at, since when, and that stage's predicted time. Each instance writes its own slot; a
    decision reads all of them (a torn read is one stale guess, never an error)."""

    def __init__(self, path):
        size = _STATIC_AT + 8
        # Kept open: the gate's tickets are given under its lock.
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.fstat(self.fd).st_size < size:
                os.ftruncate(self.fd, size)
            self.table = mmap.mmap(self.fd, size)
            self.ring = np.frombuffer(
                self.table, dtype=np.int64, count=DISPATCH_RING + 1, offset=_RING_AT
            )
            self.gate = np.frombuffer(
                self.table, dtype=np.int64, count=2 + INFLIGHT_SLOTS * _GATE_FIELDS, offset=_GATE_AT
            )
            # Per slot: pid, ticket, state, deadline ns (one row each).
            self.gate_slots = self.gate[2:].reshape(INFLIGHT_SLOTS, _GATE_FIELDS)
            self.polled = np.frombuffer(
                self.table, dtype=np.int64, count=_POLL_FIELDS, offset=_POLL_AT
            )
            self.static_free = np.frombuffer(self.table, dtype=np.int64, count=1, offset=_STATIC_AT)
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
        """Count a request this instance takes up, which arrived at ``arrived_ns`` (ns since
        the epoch; None: now), and return the pod's arrival rate over the RATE_WINDOW_S up to
        that arrival, per s: every request that arrived before it has been taken up (FIFO), so
        this counts the requests still queued in front of the router too, which a count of
        take-ups up to now would not (a lost count in a race between instances only blurs it)."""
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
        """The pod's poller read ``count`` at ``polled_ns`` with ``taken`` take-ups counted
        (``count`` None: the poll failed, so there is no fresh count)."""
        self.polled[1], self.polled[2] = count or 0, taken
        # Written last: a reader that sees the new time sees the count beside it (a torn read
        # is one stale guess, never an error).
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
        self.gate_slots[free] = (pid, 0, GATE_FREE, 0)
        self.gate[1] += 1
        return free

    def _schedule(self, arrived_ns, fastest_ns, servers):
        """Static fastest's start of a request that arrived at ``arrived_ns`` (held under
        the lock): compass.domain.binding.static_schedule on the pod's shared ``static_free``."""
        start = max(int(arrived_ns), int(self.static_free[0]))
        self.static_free[0] = start + int(fastest_ns / servers)
        return start

    def static_start(self, arrived_ns, fastest_ns, servers):
        """When static fastest (``fastest_ns`` a request, ``servers`` at once) would start a
        request that arrived at ``arrived_ns``, in take-up order (the lag cap's schedule)."""
        with self._locked():
            return self._schedule(arrived_ns, fastest_ns, servers)

    def queue_at_gate(self, deadline_ns=None, schedule=None):
        """This instance's request waits at the gate from now, after every request already
        there (its ticket, given under the lock: arrival order across the instances); with
        ``schedule`` (arrived ns, the fastest's ns, servers), also its static fastest start,
        in the same order: returns (ticket, that start or None)."""
        entry = self.gate_slots[self.slot]
        with self._locked():
            start = None if schedule is None else self._schedule(*schedule)
            ticket = int(self.gate[0]) + 1
            self.gate[0] = ticket
            entry[0], entry[1], entry[3] = os.getpid(), ticket, int(deadline_ns or 0)
            # The state last: a reader that sees it waiting sees its ticket.
            entry[2] = GATE_WAITING
        return ticket, start

    def ahead_at_gate(self):
        """The slots of the requests ahead of this instance's at the gate: in the pipeline,
        or waiting with an earlier ticket."""
        rows = self.gate_slots
        states = rows[:, 2]
        ahead = (states == GATE_RUNNING) | (
            (states == GATE_WAITING) & (rows[:, 1] < rows[self.slot, 1])
        )
        ahead[self.slot] = False
        return np.flatnonzero(ahead)

    def enter_if_free(self, slots, ahead=None):
        """Enter the pipeline at once if fewer than ``slots`` requests are ahead of this one
        (``ahead``: ahead_at_gate's, just read): whether it did (else it still waits)."""
        if len(self.ahead_at_gate() if ahead is None else ahead) < slots:
            self.gate_slots[self.slot, 2] = GATE_RUNNING
            return True
        return False

    def pass_gate(self, slots, poll_s=GATE_POLL_S, check_s=GATE_CHECK_S):
        """Wait until fewer than ``slots`` requests are ahead of this one, then enter the
        pipeline. It looks again only after a move (the moves' count changed), every
        ``poll_s`` while next in line, GATE_FAR_POLLS times less often further back (a waiting
        stub costs little CPU). Every ``check_s`` of waiting, the requests ahead whose process
        is gone (a stub killed mid-request) are cleared: a dead process never wedges the gate."""
        checked = time.monotonic()
        seen = None
        while True:
            moves = int(self.gate[1])
            if moves != seen:
                seen = moves
                ahead = self.ahead_at_gate()
                if self.enter_if_free(slots, ahead):
                    return
                wait = poll_s if len(ahead) == slots else poll_s * GATE_FAR_POLLS
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

    def gate_followers(self):
        """The deadlines (ns since the epoch, 0 none) of the requests waiting at the gate
        behind this instance's, in arrival order."""
        rows = self.gate_slots
        behind = (rows[:, 2] == GATE_WAITING) & (rows[:, 1] > rows[self.slot, 1])
        behind[self.slot] = False
        waiting = rows[behind]
        return waiting[np.argsort(waiting[:, 1]), 3].tolist()

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


class LazyConfig(dict):
    """A request's configuration, each stage bound when the pipeline first reads one of its
    parameters (every earlier stage still unbound is bound first, in order).

    A dict, so that ``json.dumps`` and ``dict(...)`` take it as pipelines do today: every way
    to read a value goes through ``__getitem__`` or ``items``, which bind; asking whether a
    parameter exists, or its name, binds nothing. (The dict itself holds every name from the
    start: json's encoder writes ``{}`` for an empty one without asking.)"""

    def __init__(
        self,
        table,
        deadline_ns,
        inflight,
        qps=0.0,
        hurried=False,
        followers=0,
        servers=1,
        gated=False,
        static_start_ns=None,
    ):
        super().__init__(dict.fromkeys(table["stage_of"]))
        self.table = table
        self.deadline_ns = deadline_ns
        self.inflight = inflight
        self.bound = {}
        self.target = None
        self.next_stage = 0
        # The stage the request has reached (the next component it calls): a stage bound
        # before it is reached counts the time of the stages still ahead of it.
        self.at = 0
        # The last stage whose component it called (-1: none yet), and its time in each
        # stage's calls so far, ms.
        self.called = -1
        self.spent = [0.0] * len(table["stages"])
        # The slow loop: what the pod's rate (``qps``: Inflight.dispatched) allows now (all
        # where no configuration has a limit).
        limited = any(entry[4] is not None for entry in table["configs"])
        self.allowed = allowed_at(table, qps) if limited else None
        # It waited long for an instance (the table's degrade_after): the fastest completion.
        self.hurried = hurried
        # The requests waiting behind it for an instance (PendingPoller), spared as the
        # domain's follower_spare_ms spares them, shared by ``servers`` instances.
        self.followers, self.servers = followers, servers
        # Behind the gate (compass_pipeline_slots): the requests waiting there are seen, each
        # with its own deadline, read again at each stage bound.
        self.gated = gated
        # The lag cap (the table's lag_share): when static fastest would start it.
        self.static_start_ns = static_start_ns

    def _bind_through(self, stage):
        table = self.table
        while self.next_stage <= stage:
            left_ms = (self.deadline_ns - time.time_ns()) / 1e6
            backlog = self.inflight.backlog_ms(len(table["stages"]))
            at = min(self.at, self.next_stage)
            if self.gated:
                now = time.time_ns()
                behind = [
                    (deadline - now) / 1e6 if deadline else float("inf")
                    for deadline in self.inflight.gate_followers()
                ]
            else:
                behind = [left_ms] * self.followers
            # Each configuration's remaining time, read once for the rules below.
            known = {}
            lag = lag_spare_ms(
                table, self.bound, at, backlog, time.time_ns(), self.static_start_ns, known
            )
            slacks = slacks_behind_ms(table, self.bound, at, backlog, behind, self.servers, known)
            spare = min((s for s in slacks if s is not None), default=float("inf"))
            if spare < float("inf"):
                # Planned with the followers: the slack several of them can use better is
                # not all spent here (compass.domain.binding.joint_spare_ms). Where no choice
                # but its quickest fits the spare, the plan cannot change what it binds.
                own, theirs = joint_options(
                    table, self.bound, at, left_ms, backlog, self.allowed, known
                )
                extra = own[:, 0]
                if ((extra > 0) & (extra <= min(spare, lag))).any():
                    spare = min(spare, joint_spare_ms(own, theirs, slacks, self.servers, lag))
            spare = min(spare, lag)
            self.target = bind_stage(
                table,
                self.next_stage,
                self.bound,
                left_ms,
                backlog,
                self.allowed,
                at,
                self.hurried,
                spare,
                known,
            )
            chosen = table["configs"][self.target][0]
            for name in table["stages"][self.next_stage]:
                self.bound[name] = chosen[name]
                dict.__setitem__(self, name, chosen[name])
            self.next_stage += 1

    def __getitem__(self, name):
        stage = self.table["stage_of"].get(name)
        if stage is None:
            raise KeyError(name)
        if name not in self.bound:
            if self.called >= 0:
                # Read after it called a component: the pipeline is done with the stage it
                # called last (it reads a later stage's parameters when it gets there), so
                # that stage's queue and time are behind it (qa-real reads its reader so).
                self.at = max(self.at, min(stage, self.called + 1))
            self._bind_through(stage)
        return self.bound[name]

    def get(self, name, default=None):
        return self[name] if name in self.table["stage_of"] else default

    def __contains__(self, name):
        return name in self.table["stage_of"]

    def __iter__(self):
        return iter(self.table["stage_of"])

    def __len__(self):
        return len(self.table["stage_of"])

    def keys(self):
        return self.table["stage_of"].keys()

    def items(self):
        self._bind_through(len(self.table["stages"]) - 1)
        return [(name, self.bound[name]) for name in self.table["stage_of"]]

    def values(self):
        return [value for _, value in self.items()]

    def __setitem__(self, name, value):
        raise TypeError("a request's configuration is read-only")

    def reach(self, stage):
        """The request now calls ``stage``'s component."""
        self.at = max(self.at, stage)
        self.called = max(self.called, stage)

    def stage_ms(self, stage):
        """The predicted time at ``stage`` of the configuration the request heads for."""
        if self.target is None:
            return 0.0
        return self.table["configs"][self.target][2][stage]

    def stage_left_ms(self, stage):
        """What is left of that time after the request's calls at ``stage`` so far."""
        return max(self.stage_ms(stage) - self.spent[stage], 0.0)

    def spend(self, stage, ms):
        """A call at ``stage`` took ``ms``."""
        self.spent[stage] += ms

    def key(self):
        """The canonical key of the configuration served (binding what was never read)."""
        return canonical(dict(self.items()))


def staged(run_call, config, inflight):
    """``run_call`` for a bound request (``config``: its LazyConfig): each call of a stage's
    component model puts the request at that stage in the in-flight table for the call."""
    stage_of_model = config.table["stage_of_model"]

    def staged_call(model, inputs, outputs):
        stage = stage_of_model.get(model)
        if stage is None:
            return run_call(model, inputs, outputs)
        config.reach(stage)
        # What is left of the stage's time: a stage that calls several models (or one
        # several times) counts its earlier calls' time as done.
        inflight.enter(stage, config.stage_left_ms(stage))
        started = time.monotonic_ns()
        try:
            return run_call(model, inputs, outputs)
        finally:
            inflight.leave()
            config.spend(stage, (time.monotonic_ns() - started) / 1e6)

    return staged_call


def parse_deadline(deadline_ns):
    """A request's ``compass_deadline_ns`` as an int; ValueError naming the parameter."""
    if isinstance(deadline_ns, bool) or not isinstance(deadline_ns, (int, str)):
        raise ValueError(f"{DEADLINE_PARAMETER} {deadline_ns!r}: give ns since the epoch")
    try:
        return int(deadline_ns)
    except ValueError:
        raise ValueError(
            f"{DEADLINE_PARAMETER} {deadline_ns!r} is not an integer: give ns since the epoch"
        ) from None


class BindingTable(TableFile):
    """The late-binding table (check_binding)."""

    def __init__(self, path):
        super().__init__(path, check_binding)


def _unavailable(message):
    """A retryable error (UNAVAILABLE where this Triton's Python backend has codes)."""
    code = getattr(pb_utils.TritonError, "UNAVAILABLE", None)
    if code is None:
        return pb_utils.TritonError(message)
    return pb_utils.TritonError(message, code)


def _bytes_tensor(name, text):
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


def _request_body(request):
    payload = pb_utils.get_input_tensor_by_name(request, "REQUEST").as_numpy().reshape(-1)[0]
    return json.loads(payload.decode("utf-8") if isinstance(payload, bytes) else payload)


def _load_pipeline(version_dir):
    """The workflow's pipeline module from ``version_dir``, or None if there is none."""
    path = os.path.join(version_dir, "pipeline.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("compass_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(model, inputs, outputs):
    """Run a component model through BLS; returns the requested outputs as numpy arrays."""
    request = pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=list(outputs),
        inputs=[pb_utils.Tensor(name, np.asarray(value)) for name, value in inputs.items()],
    )
    response = request.exec()
    if response.has_error():
        raise RuntimeError(f"{model}: {response.error().message()}")
    return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}


def timed(run_call, times):
    """``run_call`` that adds each component model's wall time (ms) to ``times``: what
    profiling records per stage (its queue wait included: measured at idle, that is none)."""

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
            router = parameter(ROUTER_PARAMETER, args["model_name"].removesuffix("_control"))
            self.state = state_path(router)
            self.admission_file = admission_path(router)
            self.binding_file = binding_path(router)
            # The router's pipeline checks a configuration before it becomes active.
            repository = os.path.dirname(args["model_repository"].rstrip("/"))
            self.pipeline = _load_pipeline(os.path.join(repository, router, "1"))
            return
        self.pipeline = _load_pipeline(version_dir)
        if self.pipeline is None:
            raise ValueError(f"no pipeline.py in {version_dir}")
        default = canonical(json.loads(parameter(ACTIVE_PARAMETER, "{}")))
        self._check(json.loads(default))
        path = state_path(args["model_name"])
        # The first router instance publishes the default, so the control model can report it.
        write_state(path, {"config": default}, exclusive=True)
        self.active = ActiveConfig(path, default)
        self.admission = Admission(admission_path(args["model_name"]))
        self.binding = BindingTable(binding_path(args["model_name"]))
        self.inflight_path = state_path(args["model_name"]).removesuffix(".json") + "-inflight.bin"
        self.inflight = Inflight(self.inflight_path)
        # Late binding's view of the queue in front of the router: Triton's pending count,
        # polled (started with the first bound request; "off" never polls).
        self.metrics_url = parameter(
            METRICS_URL_PARAMETER, os.environ.get(METRICS_URL_ENV, DEFAULT_METRICS_URL)
        )
        poll_ms = float(parameter(POLL_MS_PARAMETER, str(DEFAULT_POLL_MS)))
        if not 0 < poll_ms < 60_000:
            raise ValueError(f"{POLL_MS_PARAMETER} {poll_ms!r}: give a period in ms, e.g. 25")
        self.poll_s = poll_ms / 1000
        self.model_name = args["model_name"]
        self.poller = None
        instances = max(
            sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])),
            1,
        )
        # The gate: at most this many requests run the pipeline at once, in arrival order
        # (None: no gate, each instance runs its request as Triton gives it).
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
        instance_name = args.get("model_instance_name", str(self.inflight.slot))
        self.gate_gauge = GateGauge(self.model_name, instance_name) if self.pipeline_slots else None
        self.counters = ServedCounters(self.model_name, instance_name)

    def _check(self, config):
        check = getattr(self.pipeline, "check_config", None)
        if check is not None and config:
            check(config)

    def execute(self, requests):
        """Answer each request; one bad request fails alone, never the others."""
        responses = []
        for request in requests:
            # What _run served (its key; None: nothing to count), counted here: after the gate's
            # slot is given back, so the count never lengthens the pipeline's turn.
            self.served_key = None
            try:
                serve = self._control if self.role == "control" else self._serve
                responses.append(serve(request))
            except LateError as error:
                self.counters.refused_one()
                responses.append(pb_utils.InferenceResponse(error=_unavailable(str(error))))
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
            if self.served_key is not None:
                self.counters.served_one(self.served_key)
        return responses

    def _serve(self, request):
        body = _request_body(request)
        key = self.active.current()
        parameters = json.loads(request.parameters() or "{}")
        table = self.binding.current()
        # Parsed once here (ns since the epoch): a malformed one is the client's error at once.
        deadline = parameters.get(DEADLINE_PARAMETER)
        deadline = None if deadline is None else parse_deadline(deadline)
        taken_up = time.time_ns()
        override = parameters.get(OVERRIDE_PARAMETER)
        if self.pipeline_slots and deadline is None and not override:
            # Client-free binding and admission: behind the gate a request is taken up as it
            # arrives, so its take-up plus the SLO is its deadline (clients need not send one).
            slo_ms = self._slo_ms(table)
            if slo_ms is not None:
                deadline = taken_up + int(slo_ms * 1e6)
        # Every request taken up counts towards the pod's rate (late binding's slow loop), at
        # its arrival where its deadline and the table's SLO tell it.
        arrived = None
        if table is not None and table["slo_ms"] is not None and deadline is not None:
            arrived = deadline - int(table["slo_ms"] * 1e6)
        qps = self.inflight.dispatched(arrived)
        # Late binding will bind it (as _run decides): a table, a deadline, no override.
        binds = table is not None and deadline is not None and not override
        # The lag cap's schedule (static fastest's), for the requests it binds: each one's
        # start there, drawn in take-up order (behind the gate with its ticket).
        schedule = None
        if binds and table["lag_share"] is not None:
            fastest_ns = table["arrays"]["fastest_ms"][1] * 1e6
            schedule = (taken_up if arrived is None else arrived, fastest_ns, self.servers)
        if not self.pipeline_slots:
            static_start = None if schedule is None else self.inflight.static_start(*schedule)
            return self._run(
                body, key, parameters, table, deadline, arrived, qps, taken_up, static_start
            )
        # The gate: the request waits its turn in the shared table (seen there with its
        # deadline by the one binding ahead of it), then runs the pipeline.
        _, static_start = self.inflight.queue_at_gate(deadline, schedule)
        try:
            # The gauge only for a request that waits: each set is a call to the server (0.24
            # ms p50, 2.9 ms p99 on 2 cores under load), and the second holds the pipeline.
            if not self.inflight.enter_if_free(self.pipeline_slots):
                self.gate_gauge.waiting(1)
                try:
                    self.inflight.pass_gate(self.pipeline_slots)
                finally:
                    self.gate_gauge.waiting(0)
            elif binds and table["settle_ms"]:
                # The first at a free pipeline: the burst it may lead reaches the gate over a
                # few ms (each request taken up by its own instance), and it binds seeing them
                # (compass.domain.binding.GATE_SETTLE_MS).
                time.sleep(table["settle_ms"] / 1000)
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

    def _run(
        self, body, key, parameters, table, deadline, arrived, qps, started, static_start=None
    ):
        """Run the pipeline for a request that started at ``started`` (ns since the epoch):
        its configuration bound, judged by admission or as routed."""
        override = parameters.get(OVERRIDE_PARAMETER)
        if override:
            key = canonical(json.loads(override) if isinstance(override, str) else override)
        elif deadline is not None:
            if table is not None:
                degrade_after = table["degrade_after"]
                hurried = (
                    arrived is not None
                    and degrade_after is not None
                    and started - arrived > degrade_after * table["slo_ms"] * 1e6
                )
                times = {} if parameters.get(COMPONENT_TIMES_PARAMETER) else None
                return self._serve_bound(body, table, deadline, qps, hurried, times, static_start)
            key = self.admission.judge(key, deadline)
        # The pipeline gets the canonical form too: its components may key data by it.
        config = json.loads(key)
        if not config:
            raise ValueError(
                f"no configuration: set the router's {ACTIVE_PARAMETER} parameter or the "
                f"request parameter {OVERRIDE_PARAMETER}"
            )
        times = {} if parameters.get(COMPONENT_TIMES_PARAMETER) else None
        result = self.pipeline.run(body, config, call if times is None else timed(call, times))
        if times is not None and isinstance(result, dict):
            result = {**result, COMPONENT_TIMES_KEY: times}
        if not override:
            self.served_key = key
        return pb_utils.InferenceResponse(
            [_bytes_tensor("RESULT", json.dumps(result)), _bytes_tensor("CONFIG", key)]
        )

    def _serve_bound(
        self, body, table, deadline_ns, qps, hurried=False, times=None, static_start=None
    ):
        """Serve a request with a lazily bound configuration (late binding); ``times``: each
        component model's wall time is added there and returned as for a routed request;
        ``static_start``: when static fastest would start it (ns since the epoch; the lag cap)."""
        followers = 0
        # Behind a gate the followers are the requests waiting at it (seen with their
        # deadlines); Triton's queue beyond the instances is not polled: the simulator finds
        # the count changes no decision there, and live the poll held each request's turn in
        # the pipeline ~4 ms longer on 2 cores (docs/method.md, "The router's poller").
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
        run_call = staged(call, config, self.inflight)
        if times is not None:
            run_call = timed(run_call, times)
        result = self.pipeline.run(body, config, run_call)
        if times is not None and isinstance(result, dict):
            result = {**result, COMPONENT_TIMES_KEY: times}
        key = config.key()
        self.served_key = key
        return pb_utils.InferenceResponse(
            [_bytes_tensor("RESULT", json.dumps(result)), _bytes_tensor("CONFIG", key)]
        )

    def _control(self, request):
        """``{"set": config}`` (optionally ``"blend": config2, "weight": share``) makes it
        active; ``{}`` only reports what is active."""
        body = _request_body(request)
        # Checked before anything is written: a bad table changes nothing.
        table = body.get("admission")
        table = None if table is None else check_admission(table)
        binding = body.get("binding")
        if binding is not None:
            check_binding(binding)
        previous = self._read()
        active = previous
        if "set" in body:
            wanted = blend_state(canonical(body["set"]), body.get("blend"), body.get("weight"))
            for key in (wanted["config"], wanted.get("blend")):
                if key:
                    self._check(json.loads(key))
            if wanted != previous:
                write_state(self.state, wanted)
            active = wanted
        if "admission" in body:
            self._set_admission(table)
        if "binding" in body:
            self._set_binding(binding)
        routing = None if active is None else routing_key(active)
        result = {
            "active": None if active is None else active["config"],
            "blend": None if active is None else active.get("blend"),
            "weight": 0.0 if active is None else active.get("weight", 0.0),
            "routing": routing,
            "previous": None if previous is None else routing_key(previous),
            "changed": active != previous,
        }
        return pb_utils.InferenceResponse(
            [_bytes_tensor("RESULT", json.dumps(result)), _bytes_tensor("CONFIG", routing or "")]
        )

    def _set_admission(self, table):
        """Write the checked admission table (None: remove it, admission off) if it changed."""
        if table is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.admission_file)
            return
        try:
            with open(self.admission_file, encoding="utf-8") as handle:
                if check_admission(json.load(handle)) == table:
                    return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        write_state(self.admission_file, table)

    def _set_binding(self, table):
        """Write the checked binding table as sent (None: remove it, late binding off) if it
        changed: every switch sends it, and the routers reread a replaced file."""
        if table is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.binding_file)
            return
        try:
            with open(self.binding_file, encoding="utf-8") as handle:
                if json.load(handle) == table:
                    return
        except (OSError, ValueError):
            pass
        write_state(self.binding_file, table)

    def _read(self):
        """The routing state, or None before the router published its default."""
        try:
            return read_state(self.state)
        except FileNotFoundError:
            return None

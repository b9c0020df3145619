"""The names the router and the operator share on the wire: request and model-config parameters,
the result key of component times, the router's metrics, and where a router keeps its files
(docs/serving.md, "The router")."""

from __future__ import annotations

import os
import tempfile

# Request parameters: the configuration a request runs (profiling, the search) instead of the
# active one, and (set) the active configuration it ran on in the reply.
ACTIVE_PARAMETER = "compass_active_config"
OVERRIDE_PARAMETER = "compass_config"
# A request that sets this gets each component model's wall time in its result, under
# COMPONENT_TIMES_KEY: {model: ms, summed over its calls} (what profiling records per stage).
COMPONENT_TIMES_PARAMETER = "compass_component_times"
COMPONENT_TIMES_KEY = "compass_component_ms"

# Model-config parameters: the model's role (router or control, the same model.py) and the
# router's gate, how many of the requests its instances take up run the pipeline at once, in
# arrival order (absent: no gate).
ROLE_PARAMETER = "compass_role"
PIPELINE_SLOTS_PARAMETER = "compass_pipeline_slots"
# The control model of router ``r`` is ``r`` + this: a switch is one request to it.
CONTROL_SUFFIX = "_control"

# Triton's pending count of a model, which the router polls and the operator reads.
PENDING_METRIC = "nv_inference_pending_request_count"
# Behind the gate Triton's pending count of the router stays near 0 (the instances take every
# request up): each instance exports 1 on this gauge while its request waits at the gate, and the
# operator's queue reading adds them back.
GATE_WAITING_METRIC = "compass_router_gate_waiting"
# Requests answered, labelled by the configuration's canonical key, and refused as late.
SERVED_METRIC = "compass_router_served_total"
REFUSED_METRIC = "compass_router_refused_total"
# A decoupled router's streams: how many it answered, and their summed times to the first
# streamed response and to the end, in seconds from take-up (per model and instance): over a
# window, each time's increase over the streams' is the mean time to first token and end to end.
STREAMS_METRIC = "compass_router_streams_total"
STREAM_FIRST_METRIC = "compass_router_stream_first_seconds_total"
STREAM_END_METRIC = "compass_router_stream_seconds_total"

# A streamed response of a decoupled router carries, in its RESULT object, the component that
# streamed it under this key.
STREAM_KEY = "compass_stream"

# Where a router keeps its files (the routing state, the tables a switch sends, its gate):
# $COMPASS_STATE_DIR, else /dev/shm (memory), else the temporary folder.
STATE_DIR_ENV = "COMPASS_STATE_DIR"


def router_file(router_model: str, server_pid: int, part: str | None = None) -> str:
    """The path of a router's file on the tritonserver of PID ``server_pid``: its routing state
    (``part`` None), or the ``part`` beside it (e.g. "binding.json")."""
    directory = os.environ.get(STATE_DIR_ENV)
    if not directory:
        shm = "/dev/shm"
        writable = os.path.isdir(shm) and os.access(shm, os.W_OK)
        directory = shm if writable else tempfile.gettempdir()
    name = f"compass-{server_identity(server_pid)}-{router_model}"
    return os.path.join(directory, f"{name}-{part}" if part else f"{name}.json")


def server_identity(pid: int) -> str:
    """A tritonserver as PID and start time: unique across restarts.

    The PID alone is not: a restarted container's server often gets the same one, and /dev/shm
    outlives the container (it is the pod's)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            # Field 22, counted after the command name (which may hold spaces).
            started = stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return str(pid)
    return f"{pid}-{started}"

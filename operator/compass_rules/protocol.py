"""The names the router and the operator share on the wire: request and model-config parameters,
the result key of component times, the router's metrics (docs/serving.md, "The router")."""

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

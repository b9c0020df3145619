"""Compass router: runs a workflow's pipeline with the active configuration (Triton Python backend, BLS).

One generic file for every workflow. The workflow itself lives in ``pipeline.py`` next to this
file: ``run(request, config, call) -> dict`` where ``call(model, inputs, outputs)`` runs a
component model through BLS. The active configuration is the model config parameter
``compass_active_config`` (JSON); Elastico switches it by reloading this model over gRPC with a
new config, and Triton keeps serving on the old instance until the new one is ready. A request
parameter ``compass_config`` (JSON) overrides it for that request only: that is how search and
profiling evaluate a configuration without moving production traffic.
"""

import importlib.util
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

ACTIVE_PARAMETER = "compass_active_config"
OVERRIDE_PARAMETER = "compass_config"


def canonical(config):
    """Canonical JSON of a configuration, the same as compass.domain.space.config_key."""

    def plain(value):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return json.dumps({k: plain(v) for k, v in config.items()}, sort_keys=True)


def _bytes_tensor(name, text):
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


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


class TritonPythonModel:
    """The router model: one instance, so Triton's pending count is the M/G/1 queue."""

    def initialize(self, args):
        """Read the active configuration and load the workflow's pipeline."""
        model_config = json.loads(args["model_config"])
        parameters = model_config.get("parameters", {})
        raw = parameters.get(ACTIVE_PARAMETER, {}).get("string_value", "{}")
        self.active_key = canonical(json.loads(raw))
        self.active = json.loads(self.active_key)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        spec = importlib.util.spec_from_file_location(
            "compass_pipeline", os.path.join(version_dir, "pipeline.py")
        )
        self.pipeline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.pipeline)
        check = getattr(self.pipeline, "check_config", None)
        if check is not None and self.active:
            # A configuration the pipeline cannot run must fail the load, so the old
            # instance keeps serving and the actuator sees the error.
            check(self.active)

    def execute(self, requests):
        """Run each request through the pipeline with its configuration."""
        responses = []
        for request in requests:
            try:
                responses.append(self._serve(request))
            # One bad request must fail alone, never the others in the batch.
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        return responses

    def _serve(self, request):
        payload = pb_utils.get_input_tensor_by_name(request, "REQUEST").as_numpy().reshape(-1)[0]
        body = json.loads(payload.decode("utf-8") if isinstance(payload, bytes) else payload)
        config, key = self.active, self.active_key
        override = json.loads(request.parameters() or "{}").get(OVERRIDE_PARAMETER)
        if override:
            key = canonical(json.loads(override) if isinstance(override, str) else override)
            # The pipeline gets the canonical form too: its components may key data by it.
            config = json.loads(key)
        if not config:
            raise ValueError(
                f"no configuration: set the router's {ACTIVE_PARAMETER} parameter or the "
                f"request parameter {OVERRIDE_PARAMETER}"
            )
        result = self.pipeline.run(body, config, call)
        return pb_utils.InferenceResponse(
            [_bytes_tensor("RESULT", json.dumps(result)), _bytes_tensor("CONFIG", key)]
        )

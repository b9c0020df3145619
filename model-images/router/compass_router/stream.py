"""Decoupled (streaming) components and a streaming router (docs/serving.md, "Streaming stages")."""

import json
import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from compass_rules.protocol import STREAM_KEY

DECOUPLED_PARAMETER = "compass_decoupled_components"
# Triton's model names: what a model repository's folder may be called.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")


def _named(text):
    """The models ``compass_decoupled_components`` names, in order; ValueError for a bad name."""
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    for name in names:
        if not _MODEL_NAME.match(name):
            raise ValueError(
                f"{DECOUPLED_PARAMETER} {text!r}: {name!r} is not a model name; give the "
                "decoupled component models' names, comma-separated (e.g. generator)"
            )
    return names


def decoupled_components(text):
    """The component models the router calls as streams."""
    return frozenset(_named(text))


def client_stream(text):
    """The last streaming stage (None: none), forwarded to the client; earlier ones are joined."""
    names = _named(text)
    return names[-1] if names else None


def router_response(result, key):
    """A router's response: ``result`` as JSON (RESULT) and the serving configuration (CONFIG)."""
    texts = (("RESULT", json.dumps(result)), ("CONFIG", key))
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor(n, np.array([t.encode("utf-8")], dtype=np.object_)) for n, t in texts]
    )


def bls_request(model, inputs, outputs):
    """A BLS request to component ``model`` (``inputs``: name to array) asking ``outputs``."""
    return pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=list(outputs),
        inputs=[pb_utils.Tensor(name, np.asarray(value)) for name, value in inputs.items()],
    )


def stream_call(model, inputs, outputs, forward=None):
    """Consume a decoupled component's stream (each response to ``forward``); outputs joined."""
    parts = {name: [] for name in outputs}
    for response in bls_request(model, inputs, outputs).exec(decoupled=True):
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        tensors = {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}
        found = {name: tensor.as_numpy() for name, tensor in tensors.items() if tensor is not None}
        # The stream's last response may only carry the final flag: nothing to forward.
        if not found:
            continue
        for name, value in found.items():
            parts[name].append(value)
        if forward is not None:
            forward(model, found)
    missing = [name for name, values in parts.items() if not values]
    if missing:
        raise RuntimeError(
            f"{model}: its stream carried no {', '.join(missing)}; is it the decoupled model "
            f"{DECOUPLED_PARAMETER} names, with those outputs?"
        )
    return {
        name: np.concatenate([np.atleast_1d(v) for v in values]) for name, values in parts.items()
    }


def _jsonable(value):
    """A streamed output as JSON: its values as a list, bytes decoded."""
    return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value.reshape(-1).tolist()]


class ClientGoneError(RuntimeError):
    """The client cancelled its stream: the pipeline stops, giving back the gate's slot."""


class ResponseStream:
    """One request's stream to its client: the last stage's outputs, then the final answer."""

    def __init__(self, request):
        self.sender = request.get_response_sender()
        self.started = time.perf_counter()
        # Seconds from take-up to the first streamed response (None: nothing streamed yet).
        self.first_s = None

    def forward(self, model, outputs):
        """Send one streamed response on; ClientGoneError once the client cancelled."""
        cancelled = getattr(self.sender, "is_cancelled", None)
        if cancelled is not None and cancelled():
            raise ClientGoneError("the client cancelled its stream")
        body = {STREAM_KEY: model, "outputs": {k: _jsonable(v) for k, v in outputs.items()}}
        self.sender.send(router_response(body, ""))
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.started

    def close(self, response):
        """Send the pipeline's answer (or its error) and end the stream."""
        self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

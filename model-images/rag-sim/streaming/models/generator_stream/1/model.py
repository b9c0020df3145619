"""rag-sim's generator, decoupled: streams its answer token by token over its share of the
configuration's measured latency (rag_sim.json at the model repository's root, as rag-sim's
component.py reads it): the first token after ``prefill_share`` of that time, the rest evenly."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A streaming generator with rag-sim's latencies and scores."""

    def initialize(self, args):
        """Load the data file and the pace parameters."""
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise ValueError(
                "generator_stream streams: its config needs model_transaction_policy "
                "{ decoupled: true }"
            )
        parameters = {k: v["string_value"] for k, v in model_config["parameters"].items()}
        self.share = float(parameters["share"])
        self.time_scale = float(parameters.get("time_scale", "1.0"))
        self.tokens = int(parameters.get("tokens", "16"))
        self.prefill_share = float(parameters.get("prefill_share", "0.25"))
        if self.tokens < 1 or not 0 <= self.prefill_share <= 1:
            raise ValueError("generator_stream: tokens must be >= 1, prefill_share in [0, 1]")
        root = os.path.dirname(args["model_repository"].rstrip("/"))
        with open(os.path.join(root, "rag_sim.json"), encoding="utf-8") as handle:
            data = json.load(handle)
        self.grid = np.asarray(data["quantile_grid"], dtype=np.float64)
        self.configs = {
            key: (np.asarray(entry["latency_quantiles_ms"]), np.asarray(entry["scores"]))
            for key, entry in data["configs"].items()
        }

    def execute(self, requests):
        """Stream each request's tokens, the last with its score; None, as a decoupled model."""
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._stream(request, sender)
            except Exception as error:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None

    def _stream(self, request, sender):
        raw = _scalar(request, "CONFIG")
        key = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        if key not in self.configs:
            raise ValueError(f"configuration {key} is not in rag-sim's space")
        quantiles, scores = self.configs[key]
        u = float(_scalar(request, "QUANTILE"))
        score = scores[int(_scalar(request, "SAMPLE")) % len(scores)]
        total_s = self.share * float(np.interp(u, self.grid, quantiles)) * self.time_scale / 1000
        first_s = total_s * self.prefill_share
        step_s = (total_s - first_s) / max(self.tokens - 1, 1)
        started = time.perf_counter()
        for index in range(self.tokens):
            # Paced against the start, so the sends' own time never stretches the stream.
            due = started + first_s + index * step_s
            time.sleep(max(0.0, due - time.perf_counter()))
            token = np.array([f"t{index} ".encode()], dtype=np.object_)
            outputs = [pb_utils.Tensor("TOKEN", token)]
            last = index == self.tokens - 1
            if last:
                outputs.append(pb_utils.Tensor("SCORE", np.array([score], dtype=np.float32)))
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
            sender.send(pb_utils.InferenceResponse(outputs), flags=flags)


def _scalar(request, name):
    """The single value of an input."""
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]

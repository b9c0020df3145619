"""A rag-sim component: serves its share of a configuration's measured latency; the generator
also returns the measured correctness of the question.

Data: ``rag_sim.json`` at the model repository's root (``hack/gen_rag_sim.py`` writes it from the
paper's latency profiles and accuracy grid): per configuration its latency quantile function
(101 points, ms) and its per-question scores.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """retriever, reranker or generator, by the model config's ``share`` and ``scores``."""

    def initialize(self, args):
        """Load the data file and this component's share of the latency."""
        model_config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in model_config["parameters"].items()}
        self.share = float(parameters["share"])
        self.time_scale = float(parameters.get("time_scale", "1.0"))
        self.returns_score = parameters.get("returns_score", "false") == "true"
        self.batch_cost = float(parameters.get("batch_cost", "1.0"))
        root = os.path.dirname(args["model_repository"].rstrip("/"))
        with open(os.path.join(root, "rag_sim.json"), encoding="utf-8") as handle:
            data = json.load(handle)
        self.grid = np.asarray(data["quantile_grid"], dtype=np.float64)
        self.configs = {
            key: (np.asarray(entry["latency_quantiles_ms"]), np.asarray(entry["scores"]))
            for key, entry in data["configs"].items()
        }

    def execute(self, requests):
        """Sleep this component's share of the batch's latency, then answer every request.

        With dynamic batching (the generator) Triton hands several requests at once. The batch
        takes its longest request's share x (1 + batch_cost (n - 1)): what batching costs on an
        accelerator, where n requests take little more than one. A batch of one takes exactly
        its request's share. (compass.domain.podmodel.RAG_SIM_STAGES is the same model.)
        """
        served = []
        latencies = []
        for request in requests:
            # The router hands the pipeline the canonical configuration, and the pipeline sends
            # it as sorted JSON: the data file's key as it stands.
            raw = _scalar(request, "CONFIG")
            key = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            if key not in self.configs:
                served.append(
                    pb_utils.TritonError(f"configuration {key} is not in rag-sim's space")
                )
                continue
            quantiles, scores = self.configs[key]
            u = float(_scalar(request, "QUANTILE"))
            sample = int(_scalar(request, "SAMPLE"))
            latencies.append(float(np.interp(u, self.grid, quantiles)))
            served.append(scores[sample % len(scores)])
        if latencies:
            batch = 1 + self.batch_cost * (len(latencies) - 1)
            time.sleep(self.share * max(latencies) * batch * self.time_scale / 1000.0)
        responses = []
        for request, outcome in zip(requests, served, strict=True):
            if isinstance(outcome, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(error=outcome))
                continue
            shape = _shape(request)
            if self.returns_score:
                score = np.full(shape, outcome, dtype=np.float32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORE", score)]))
            else:
                done = np.full(shape, True, dtype=np.bool_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DONE", done)]))
        return responses


def _scalar(request, name):
    """The single value of an input, with or without the batch dimension."""
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


def _shape(request):
    """The shape of an output: [1], or [1, 1] under the batch dimension."""
    return pb_utils.get_input_tensor_by_name(request, "SAMPLE").as_numpy().shape

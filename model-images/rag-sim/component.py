"""A rag-sim component: serves its own stage's time for the parameters it is sent; the generator
also returns the measured correctness of the question.

Data: ``rag_sim.json`` at the model repository's root (``hack/gen_rag_sim.py`` writes it from the
paper's latency profiles and accuracy grid): per configuration its latency quantile function
(ms) and its per-question scores; per stage, the parameters its time depends on and, for the
stages before the last, their quantile function per value. The last stage (the generator)
serves the rest of its configuration's time, so a configuration's stages add up to its
measured latency. A stage's time never depends on a later stage's parameters: the pipeline
need not know them before it calls the stage (the router binds them stage by stage).
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """retriever, reranker or generator: the stage of ``rag_sim.json`` its model is named for."""

    def initialize(self, args):
        """Load the data file and this component's stage of it."""
        model_config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in model_config["parameters"].items()}
        self.time_scale = float(parameters.get("time_scale", "1.0"))
        self.returns_score = parameters.get("returns_score", "false") == "true"
        self.batch_cost = float(parameters.get("batch_cost", "1.0"))
        root = os.path.dirname(args["model_repository"].rstrip("/"))
        with open(os.path.join(root, "rag_sim.json"), encoding="utf-8") as handle:
            data = json.load(handle)
        stages = {stage["component"]: stage for stage in data["stages"]}
        name = parameters.get("stage", args["model_name"])
        if name not in stages:
            raise ValueError(
                f"rag-sim component {args['model_name']!r}: no stage {name!r} in rag_sim.json "
                f"(it has {', '.join(stages)}); set the model's `stage` parameter to one of them"
            )
        stage = stages[name]
        self.parameters = tuple(stage["parameters"])
        self.grid = np.asarray(data["quantile_grid"], dtype=np.float64)
        self.own = _tables(stage)
        # The last stage: the configuration's time less the earlier stages' (their tables).
        self.rest = bool(stage.get("rest"))
        self.earlier = (
            [(tuple(s["parameters"]), _tables(s)) for s in data["stages"] if s.get("quantiles_ms")]
            if self.rest
            else []
        )
        self.configs = {
            key: (np.asarray(entry["latency_quantiles_ms"]), np.asarray(entry["scores"]))
            for key, entry in data["configs"].items()
        }

    def execute(self, requests):
        """Sleep the batch's time for this stage, then answer every request.

        With dynamic batching (the generator) Triton hands several requests at once. The batch
        takes its longest request's time x (1 + batch_cost (n - 1)): what batching costs on an
        accelerator, where n requests take little more than one. A batch of one takes exactly
        its request's time. (compass.domain.podmodel.RAG_SIM_STAGES batches the same way.)
        """
        served = []
        latencies = []
        for request in requests:
            try:
                latency, outcome = self._serve(request)
            except ValueError as error:
                served.append(pb_utils.TritonError(str(error)))
                continue
            latencies.append(latency)
            served.append(outcome)
        if latencies:
            batch = 1 + self.batch_cost * (len(latencies) - 1)
            time.sleep(max(latencies) * batch * self.time_scale / 1000.0)
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

    def _serve(self, request):
        """This request's time at this stage (ms, unscaled) and its score (the generator)."""
        raw = _scalar(request, "CONFIG")
        sent = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
        u = float(_scalar(request, "QUANTILE"))
        sample = int(_scalar(request, "SAMPLE"))
        if not self.rest:
            key = _key(sent, self.parameters)
            if key not in self.own:
                raise ValueError(f"{key} is not in rag-sim's space")
            return float(np.interp(u, self.grid, self.own[key])), None
        # The last stage is sent the whole configuration: its score and its time's rest.
        key = json.dumps(sent, sort_keys=True)
        if key not in self.configs:
            raise ValueError(f"configuration {key} is not in rag-sim's space")
        quantiles, scores = self.configs[key]
        latency = float(np.interp(u, self.grid, quantiles))
        for names, tables in self.earlier:
            latency -= float(np.interp(u, self.grid, tables[_key(sent, names)]))
        return latency, scores[sample % len(scores)]


def _tables(stage):
    """A stage's quantile functions by the canonical key of its own parameters."""
    return {
        key: np.asarray(q, dtype=np.float64) for key, q in stage.get("quantiles_ms", {}).items()
    }


def _key(sent, names):
    """The canonical key of ``names`` in a sent configuration, naming any it lacks."""
    missing = [name for name in names if name not in sent]
    if missing:
        raise ValueError(f"rag-sim: the request's CONFIG lacks {', '.join(missing)}")
    return json.dumps({name: sent[name] for name in names}, sort_keys=True)


def _scalar(request, name):
    """The single value of an input, with or without the batch dimension."""
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


def _shape(request):
    """The shape of an output: [1], or [1, 1] under the batch dimension."""
    return pb_utils.get_input_tensor_by_name(request, "SAMPLE").as_numpy().shape

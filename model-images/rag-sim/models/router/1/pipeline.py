"""rag-sim's workflow DAG: retriever -> reranker -> generator, run by the Compass router.

Each stage's parameters are read just before that stage's call, never earlier: under
per-request binding the router binds a stage's parameters when the pipeline first reads one
of them (docs/serving.md, "Writing a pipeline").
"""

import json
import random

import numpy as np

PARAMETERS = ("generator_model", "retriever_k", "reranker_k", "reranker_model")


def check_config(config):
    """Reject a configuration the workflow cannot run, naming the problem (the control model
    checks each configuration it is asked to make active)."""
    missing = [name for name in PARAMETERS if name not in config]
    if missing:
        raise ValueError(f"configuration lacks {', '.join(missing)}")
    _check_reranker(config["retriever_k"], config["reranker_k"])


def _check_reranker(retriever_k, reranker_k):
    if int(reranker_k) > int(retriever_k):
        raise ValueError("reranker_k must be <= retriever_k")


def _read(config, names):
    """This stage's parameters, read from the configuration now (binding them)."""
    missing = [name for name in names if name not in config]
    if missing:
        raise ValueError(f"configuration lacks {', '.join(missing)}")
    return {name: config[name] for name in names}


def run(request, config, call):
    """Answer one question (``request["sample"]``) with this configuration."""
    sample = int(request["sample"])
    # One latency quantile per request, shared by the three components: their service times
    # are comonotone, so the total is distributed exactly as the paper measured it end to end.
    quantile = float(request.get("quantile", random.random()))

    def inputs(parameters):
        return {
            "CONFIG": np.array(
                [json.dumps(parameters, sort_keys=True).encode("utf-8")], dtype=np.object_
            ),
            "SAMPLE": np.array([sample], dtype=np.int64),
            "QUANTILE": np.array([quantile], dtype=np.float32),
        }

    retriever = _read(config, ("retriever_k",))
    call("retriever", inputs(retriever), ["DONE"])
    reranker = _read(config, ("reranker_model", "reranker_k"))
    _check_reranker(retriever["retriever_k"], reranker["reranker_k"])
    call("reranker", inputs(reranker), ["DONE"])
    # The generator is sent the whole configuration (its answer's score depends on every
    # stage's choice); its own parameter is read, and bound, only now.
    whole = {**retriever, **reranker, **_read(config, ("generator_model",))}
    # The generator batches: its inputs carry the batch dimension.
    batched = {name: value.reshape(1, -1) for name, value in inputs(whole).items()}
    score = call("generator", batched, ["SCORE"])["SCORE"]
    return {"sample": sample, "score": float(score.reshape(-1)[0])}

"""rag-sim's workflow DAG: retriever -> reranker -> generator, run by the Compass router."""

import json
import random

import numpy as np

PARAMETERS = ("generator_model", "retriever_k", "reranker_k", "reranker_model")


def check_config(config):
    """Reject a configuration the workflow cannot run, naming the problem."""
    missing = [name for name in PARAMETERS if name not in config]
    if missing:
        raise ValueError(f"configuration lacks {', '.join(missing)}")
    if int(config["reranker_k"]) > int(config["retriever_k"]):
        raise ValueError("reranker_k must be <= retriever_k")


def run(request, config, call):
    """Answer one question (``request["sample"]``) with this configuration."""
    check_config(config)
    sample = int(request["sample"])
    # One latency quantile per request, shared by the three components: their service times
    # are comonotone shares of the configuration's measured distribution, so the total is
    # distributed exactly as the paper measured it end to end.
    quantile = float(request.get("quantile", random.random()))
    inputs = {
        "CONFIG": np.array([json.dumps(config, sort_keys=True).encode("utf-8")], dtype=np.object_),
        "SAMPLE": np.array([sample], dtype=np.int64),
        "QUANTILE": np.array([quantile], dtype=np.float32),
    }
    call("retriever", inputs, ["DONE"])
    call("reranker", inputs, ["DONE"])
    # The generator batches: its inputs carry the batch dimension.
    batched = {name: value.reshape(1, -1) for name, value in inputs.items()}
    score = call("generator", batched, ["SCORE"])["SCORE"]
    return {"sample": sample, "score": float(score.reshape(-1)[0])}

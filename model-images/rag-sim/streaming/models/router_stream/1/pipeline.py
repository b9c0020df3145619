"""rag-sim's workflow with its generator streaming: retriever -> reranker -> generator_stream."""

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
    """Answer one question (``request["sample"]``), the generator's tokens streamed."""
    check_config(config)
    sample = int(request["sample"])
    # One latency quantile shared by the components, as in rag-sim's pipeline.
    quantile = float(request.get("quantile", random.random()))
    inputs = {
        "CONFIG": np.array([json.dumps(config, sort_keys=True).encode("utf-8")], dtype=np.object_),
        "SAMPLE": np.array([sample], dtype=np.int64),
        "QUANTILE": np.array([quantile], dtype=np.float32),
    }
    call("retriever", inputs, ["DONE"])
    call("reranker", inputs, ["DONE"])
    # A decoupled component: the router returns its stream's outputs joined, in order.
    answer = call("generator_stream", inputs, ["TOKEN", "SCORE"])
    text = "".join(t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in answer["TOKEN"])
    return {"sample": sample, "score": float(answer["SCORE"].reshape(-1)[0]), "text": text}

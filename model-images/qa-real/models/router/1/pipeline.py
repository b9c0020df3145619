"""qa-real's workflow DAG, run by the Compass router (model-images/router/model.py):

    retriever: bm25 | dense | both fused by reciprocal rank (hybrid)
      -> reranker (rerank: minilm; rescores qa_common.POOL candidates) or nothing
      -> reader on the top_k passages (reader: lexical | minilm), which grades its answer

A request is {"sample": i}: question i (mod the set size) of qa_real.json. The result carries
the score (1.0 when the answer sentence states a gold answer from a supporting passage), the
answer, the passages read and each stage's wall time.
"""

import os
import sys
import time

# qa_common.py sits at the model repository's root, three folders up from this file, as for the
# component models.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import numpy as np
import qa_common as common

# The configuration space; model-images/qa-real/space.yaml declares the same one.
SPACE = {
    "retriever": ("bm25", "dense", "hybrid"),
    "top_k": (1, 3, 5, 10),
    "rerank": ("none", "minilm"),
    "reader": ("lexical", "minilm"),
}

DATA = common.load_data(os.path.dirname(common.__file__))


def _matches(value, allowed):
    if isinstance(allowed, str) or isinstance(value, bool):
        return value == allowed
    return isinstance(value, int | float) and float(value) == float(allowed)


def check_config(config):
    """Reject a configuration outside the space, naming the parameter and its values."""
    unknown = sorted(set(config) - set(SPACE))
    if unknown:
        raise ValueError(
            f"{unknown[0]} is not a parameter of qa-real; its parameters are {', '.join(SPACE)}"
        )
    for name, values in SPACE.items():
        listed = ", ".join(str(v) for v in values)
        if name not in config:
            raise ValueError(f"configuration lacks {name}: one of {listed}")
        if not any(_matches(config[name], v) for v in values):
            raise ValueError(f"{name}={config[name]!r} is not in qa-real's space: one of {listed}")


def _text(value):
    return np.array([value.encode("utf-8")], dtype=np.object_)


def _text_list(values):
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def _strings(array):
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def _search(model, question, k, call):
    inputs = {"QUESTION": _text(question), "K": np.array([k], dtype=np.int64)}
    return _strings(call(model, inputs, ["IDS"])["IDS"])


def run(request, config, call):
    """Answer question ``request["sample"]`` with this configuration."""
    check_config(config)
    sample = int(request["sample"])
    gold = common.question_of(DATA, sample)
    question = gold["question"]
    top_k = int(config["top_k"])
    rerank = config["rerank"] == "minilm"
    depth = max(common.POOL, top_k) if rerank else top_k
    stages = {}

    started = time.perf_counter()
    if config["retriever"] == "hybrid":
        pool = max(common.POOL, depth)
        rankings = [_search(m, question, pool, call) for m in ("bm25", "dense")]
        ids = common.fuse(rankings)[:depth]
    else:
        ids = _search(config["retriever"], question, depth, call)
    stages["retrieve"] = time.perf_counter() - started

    if rerank:
        started = time.perf_counter()
        # The reranker batches: one request is [1, ...] (a batch of one).
        inputs = {"QUESTION": _text(question).reshape(1, 1), "IDS": _text_list(ids).reshape(1, -1)}
        reply = call("reranker", inputs, ["IDS"])
        ids = _strings(reply["IDS"])
        stages["rerank"] = time.perf_counter() - started
    ids = ids[:top_k]

    started = time.perf_counter()
    reply = call(
        "reader",
        {
            "QUESTION": _text(question),
            "IDS": _text_list(ids),
            "MODE": _text(config["reader"]),
            "SAMPLE": np.array([sample], dtype=np.int64),
        },
        ["ANSWER", "PASSAGE", "SCORE"],
    )
    stages["read"] = time.perf_counter() - started
    return {
        "sample": sample,
        "question": gold["id"],
        "score": float(reply["SCORE"].reshape(-1)[0]),
        "answer": _strings(reply["ANSWER"])[0],
        "passage": _strings(reply["PASSAGE"])[0],
        "read": ids,
        "stages_ms": {name: round(seconds * 1000.0, 3) for name, seconds in stages.items()},
    }

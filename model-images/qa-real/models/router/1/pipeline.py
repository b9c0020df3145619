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


def check_names(config):
    """Reject a configuration with a parameter outside the space or one missing (its names
    only: under late binding, reading a value binds its stage)."""
    unknown = sorted(set(config) - set(SPACE))
    if unknown:
        raise ValueError(
            f"{unknown[0]} is not a parameter of qa-real; its parameters are {', '.join(SPACE)}"
        )
    for name, values in SPACE.items():
        if name not in config:
            raise ValueError(f"configuration lacks {name}: one of {', '.join(map(str, values))}")


def value_of(config, name):
    """``config[name]``, rejected (naming it and its values) unless in the space."""
    value = config[name]
    if not any(_matches(value, v) for v in SPACE[name]):
        listed = ", ".join(str(v) for v in SPACE[name])
        raise ValueError(f"{name}={value!r} is not in qa-real's space: one of {listed}")
    return value


def check_config(config):
    """Reject a configuration outside the space, naming the parameter and its values."""
    check_names(config)
    for name in SPACE:
        value_of(config, name)


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
    """Answer question ``request["sample"]`` with this configuration, reading each parameter
    when the stage that needs it comes (the router's late binding binds it then): the
    retriever, top_k and rerank before retrieval, the reader before reading."""
    check_names(config)
    sample = int(request["sample"])
    gold = common.question_of(DATA, sample)
    question = gold["question"]
    retriever = value_of(config, "retriever")
    top_k = int(value_of(config, "top_k"))
    rerank = value_of(config, "rerank") == "minilm"
    depth = max(common.POOL, top_k) if rerank else top_k
    stages = {}

    started = time.perf_counter()
    if retriever == "hybrid":
        pool = max(common.POOL, depth)
        rankings = [_search(m, question, pool, call) for m in ("bm25", "dense")]
        ids = common.fuse(rankings)[:depth]
    else:
        ids = _search(retriever, question, depth, call)
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
    reader = value_of(config, "reader")
    reply = call(
        "reader",
        {
            "QUESTION": _text(question),
            "IDS": _text_list(ids),
            "MODE": _text(reader),
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

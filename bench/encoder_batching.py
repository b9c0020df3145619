"""What a dynamic batch costs qa-real's encoder (all-MiniLM-L6-v2) on a device, and what the
device's precision does to qa-real's answers.

The simulator and rag-sim's components model a batch of n requests as taking its longest
request's time x (1 + batch_cost (n - 1)) (compass.domain.podmodel.Stage); rag-sim's generator
assumes batch_cost 0.25. This measures the real figure for qa-real's heaviest encoder user, the
reranker: one request is a question and the sentences of its 10 BM25 candidates (about 31
texts), and a batch of n requests is one call of the encoder on all their texts, the call the
Triton model makes for a dynamic batch (qa_common.encoder_of, the same function).

Per variant (``--variants cpu:float32,cuda:float16``): the median time of a batch of
1, 2, 4, ... requests, the batch_cost fitted to them (least squares on t(n) / t(1) - 1 =
c (n - 1)), and the accuracy of qa-real's MiniLM configurations through the router's own
pipeline (model-images/qa-real/models/router/1/pipeline.py) with that encoder, against the
first variant's.

    .venv/bin/python bench/encoder_batching.py                      # this CPU, 1 thread
    python3 bench/encoder_batching.py --variants cpu:float32,cuda:float32,cuda:float16
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

MODELS = Path(__file__).resolve().parent.parent / "model-images" / "qa-real" / "models"
# qa-real's configurations that run the encoder, and the accuracy model-images/qa-real/README.md
# reports for each (all 149 questions, float32 on a CPU).
CONFIGS = (
    {"retriever": "bm25", "top_k": 1, "rerank": "none", "reader": "minilm"},
    {"retriever": "bm25", "top_k": 3, "rerank": "none", "reader": "minilm"},
    {"retriever": "bm25", "top_k": 1, "rerank": "minilm", "reader": "minilm"},
    {"retriever": "dense", "top_k": 10, "rerank": "none", "reader": "minilm"},
    {"retriever": "hybrid", "top_k": 3, "rerank": "minilm", "reader": "minilm"},
)
Array = npt.NDArray[Any]
Encode = Callable[[Sequence[str]], Array]


@dataclass
class BatchTime:
    """The encoder's time for one batch size."""

    requests: int
    texts: int
    median_ms: float
    p90_ms: float
    calls: int
    # Of the whole batch at once (the encoder chunks and sorts by length): where the time goes.
    tokenize_ms: float = float("nan")
    forward_ms: float = float("nan")


@dataclass
class Variant:
    """One device and precision: its batch times, fitted batch cost and accuracies."""

    device: str
    precision: str
    load_s: float
    batches: list[BatchTime] = field(default_factory=list)
    batch_cost: float = float("nan")
    accuracy: dict[str, float] = field(default_factory=dict)


def load_module(name: str, path: Path) -> ModuleType:
    """Import a file of the model repository by path (Triton puts it on no package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def reranker_requests(common: ModuleType, data: dict[str, Any]) -> list[list[str]]:
    """One reranker request's texts per question: the question and its candidates' sentences."""
    sparse = common.Sparse(data)
    requests = []
    for question in data["questions"]:
        ids, _ = sparse.search(question["question"], common.POOL)
        texts = [question["question"]]
        for passage in ids:
            texts += common.sentences(data["by_id"][passage]["text"])
        requests.append(texts)
    return requests


def fit_batch_cost(times: Sequence[BatchTime]) -> float:
    """The c of t(n) = t(1) (1 + c (n - 1)) closest to the measured times (least squares)."""
    single = next(t.median_ms for t in times if t.requests == 1)
    pairs = [(t.requests - 1, t.median_ms / single - 1.0) for t in times if t.requests > 1]
    if not pairs:
        raise ValueError("fitting a batch cost needs a batch of more than one request")
    return sum(x * y for x, y in pairs) / sum(x * x for x, _ in pairs)


def time_batches(
    encode: Encode,
    requests: list[list[str]],
    sizes: Sequence[int],
    seconds: float,
    sync: Callable[[], None],
    stages: Callable[[list[list[str]]], tuple[float, float]] | None = None,
) -> list[BatchTime]:
    """The encoder's median and 90th-percentile time per batch size, over ``seconds`` each."""
    results = []
    for size in sizes:
        # Different questions each call, as a live batch would have.
        batches = [
            [text for request in requests[start : start + size] for text in request]
            for start in range(0, len(requests) - size + 1, size)
        ]
        for batch in batches[:3]:  # warm-up: new shapes, allocator, kernels
            encode(batch)
        sync()
        samples: list[float] = []
        begun = time.perf_counter()
        while len(samples) < 5 or time.perf_counter() - begun < seconds:
            batch = batches[len(samples) % len(batches)]
            started = time.perf_counter()
            encode(batch)
            sync()
            samples.append((time.perf_counter() - started) * 1000.0)
        texts = round(statistics.fmean(len(b) for b in batches))
        p90 = statistics.quantiles(samples, n=10)[-1]
        results.append(BatchTime(size, texts, statistics.median(samples), p90, len(samples)))
        if stages is not None:
            results[-1].tokenize_ms, results[-1].forward_ms = stages(batches)
    return results


def stage_timer(
    model: Any, device: str, sync: Callable[[], None]
) -> Callable[[list[list[str]]], tuple[float, float]]:
    """Median tokenising and forward-pass times of batches, on the encoder's own model."""
    import torch

    def stages(batches: list[list[str]]) -> tuple[float, float]:
        tokenize, forward = [], []
        for index in range(5):
            batch = batches[index % len(batches)]
            started = time.perf_counter()
            features = model.tokenize(batch)
            tokenized = time.perf_counter()
            features = {
                key: value.to(device) if isinstance(value, torch.Tensor) else value
                for key, value in features.items()
            }
            with torch.inference_mode():
                model(features)
            sync()
            tokenize.append((tokenized - started) * 1000.0)
            forward.append((time.perf_counter() - tokenized) * 1000.0)
        return statistics.median(tokenize), statistics.median(forward)

    return stages


def local_call(common: ModuleType, data: dict[str, Any], encode: Encode) -> Callable[..., Any]:
    """The router's ``call(model, inputs, outputs)``, answered by qa-real's component classes
    in this process instead of Triton's BLS: the pipeline's own code decides what is asked."""
    indexes = {"bm25": common.Sparse(data), "dense": common.Dense(data, encode)}
    reranker = common.Reranker(data, encode)
    reader = common.Reader(data, encode)

    def strings(array: Array) -> list[str]:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]

    def text(values: Sequence[str]) -> Array:
        return np.array([v.encode("utf-8") for v in values], dtype=np.object_)

    def call(model: str, inputs: dict[str, Array], outputs: list[str]) -> dict[str, Any]:
        question = strings(inputs["QUESTION"])[0]
        if model in indexes:
            ids, _ = indexes[model].search(question, int(inputs["K"].reshape(-1)[0]))
            return {"IDS": text(ids)}
        if model == "reranker":
            ids, _ = reranker.rerank(question, strings(inputs["IDS"]))
            return {"IDS": text(ids).reshape(1, -1)}
        if model == "reader":
            passage, answer = reader.read(
                question, strings(inputs["IDS"]), strings(inputs["MODE"])[0]
            )
            gold = common.question_of(data, int(inputs["SAMPLE"].reshape(-1)[0]))
            return {
                "ANSWER": text([answer]),
                "PASSAGE": text([passage]),
                "SCORE": np.array([common.supports(gold, passage, answer)], dtype=np.float32),
            }
        raise ValueError(f"qa-real has no component {model!r}")

    return call


def accuracies(
    pipeline: ModuleType,
    common: ModuleType,
    data: dict[str, Any],
    encode: Encode,
    configs: Sequence[dict[str, Any]] = CONFIGS,
) -> dict[str, float]:
    """Each configuration's mean score over every question, through the router's pipeline."""
    call = local_call(common, data, encode)
    result = {}
    for config in configs:
        scores = [
            pipeline.run({"sample": i}, config, call)["score"]
            for i in range(len(data["questions"]))
        ]
        result[label(config)] = statistics.fmean(scores)
    return result


def label(config: dict[str, Any]) -> str:
    """A configuration as the README's tables name it."""
    return f"{config['retriever']}/{config['top_k']}/{config['rerank']}/{config['reader']}"


def measure(
    device: str,
    precision: str,
    threads: int,
    sizes: Sequence[int],
    seconds: float,
    with_accuracy: bool,
) -> Variant:
    """Load the encoder on one device and precision and measure it."""
    import torch

    # The pipeline imports qa_common by name: it finds this one in sys.modules.
    common = load_module("qa_common", MODELS / "qa_common.py")
    pipeline = load_module("qa_real_pipeline", MODELS / "router" / "1" / "pipeline.py")
    data = common.load_data(str(MODELS))
    started = time.perf_counter()
    model = common.load_minilm(threads, device, precision)
    encode = common.encoder_of(model)
    encode(["warm-up"])
    load_s = time.perf_counter() - started
    on_gpu = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    variant = Variant(device, precision, load_s)
    stages = stage_timer(model, device, sync)
    requests = reranker_requests(common, data)
    variant.batches = time_batches(encode, requests, sizes, seconds, sync, stages)
    variant.batch_cost = fit_batch_cost(variant.batches)
    if with_accuracy:
        variant.accuracy = accuracies(pipeline, common, data, encode)
    return variant


def describe_device(device: str) -> str:
    """What runs a variant: the GPU's name, or the CPU's thread count."""
    import torch

    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__}"
    return f"CPU, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}"


def report(variant: Variant, baseline: Variant | None) -> list[str]:
    """A variant's lines: batch times against the fitted model, then its accuracies."""
    single = variant.batches[0].median_ms
    lines = [
        f"{variant.device} {variant.precision} ({describe_device(variant.device)}); "
        f"loaded in {variant.load_s:.1f} s",
        "  requests  texts  median ms    p90 ms  ms/request  t(n)/t(1)  model  calls"
        "  tokenize ms  forward ms",
    ]
    for batch in variant.batches:
        model = 1 + variant.batch_cost * (batch.requests - 1)
        lines.append(
            f"  {batch.requests:8d}  {batch.texts:5d}  {batch.median_ms:9.2f}  {batch.p90_ms:8.2f}"
            f"  {batch.median_ms / batch.requests:10.2f}  {batch.median_ms / single:9.2f}"
            f"  {model:5.2f}  {batch.calls:5d}  {batch.tokenize_ms:11.2f}  {batch.forward_ms:10.2f}"
        )
    lines.append(
        f"  batch_cost {variant.batch_cost:.3f} (rag-sim's generator assumes 0.25; 1 is no gain)"
    )
    for name, value in variant.accuracy.items():
        versus = ""
        if baseline is not None and name in baseline.accuracy:
            delta = value - baseline.accuracy[name]
            versus = f"  ({delta:+.3f} against {baseline.device} {baseline.precision})"
        lines.append(f"  accuracy {name:24s} {value:.3f}{versus}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants",
        default="cpu:float32",
        help="device:precision pairs, comma-separated (the first is the accuracy baseline)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (deployed: 1)")
    parser.add_argument("--sizes", default="1,2,4,8,16,32", help="requests per batch")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per batch size")
    parser.add_argument(
        "--no-accuracy",
        action="store_true",
        help="time batches only (the accuracies take minutes on one CPU thread)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if sizes[0] != 1 or len(sizes) < 2:
        parser.error("--sizes must hold 1 and at least one larger batch")
    variants: list[Variant] = []
    for item in args.variants.split(","):
        device, _, precision = item.partition(":")
        variant = measure(
            device, precision or "float32", args.threads, sizes, args.seconds, not args.no_accuracy
        )
        print("\n".join(report(variant, variants[0] if variants else None)), flush=True)
        variants.append(variant)
    if len(variants) > 1:
        base = variants[0]
        for variant in variants[1:]:
            speedups = ", ".join(
                f"{b.requests}: {a.median_ms / b.median_ms:.1f}x"
                for a, b in zip(base.batches, variant.batches, strict=True)
            )
            print(
                f"{variant.device} {variant.precision} against {base.device} {base.precision}, "
                f"batch time per batch size: {speedups}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(v) for v in variants], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

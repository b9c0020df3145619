"""qa-real's reranker: orders candidates by their best sentence's MiniLM similarity."""

import importlib.util
import os


def load_common(args):
    """qa_common.py from the model repository's root (beside the data file) and that root."""
    root = os.path.dirname(args["model_repository"].rstrip("/"))
    spec = importlib.util.spec_from_file_location("qa_common", os.path.join(root, "qa_common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, root


class TritonPythonModel:
    """QUESTION, IDS -> the same IDS best first, and their SCORES."""

    def initialize(self, args):
        """Load the corpus; sentences are embedded by the ``encoder`` model through BLS."""
        common, root = load_common(args)
        self.common = common
        self.reranker = common.Reranker(common.load_data(root), common.triton_encoder())

    def execute(self, requests):
        """Rerank each request's candidates."""
        return self.common.respond_each(requests, self._rerank)

    def _rerank(self, request):
        strings = self.common.strings
        ranked = self.reranker.rerank(strings(request, "QUESTION")[0], strings(request, "IDS"))
        return self.common.ranked_tensors(*ranked)

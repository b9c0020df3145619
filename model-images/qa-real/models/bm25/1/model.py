"""qa-real's sparse retriever: BM25 over the corpus (numpy only)."""

import importlib.util
import os

import triton_python_backend_utils as pb_utils


def load_common(args):
    """qa_common.py from the model repository's root (beside the data file) and that root."""
    root = os.path.dirname(args["model_repository"].rstrip("/"))
    spec = importlib.util.spec_from_file_location("qa_common", os.path.join(root, "qa_common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, root


class TritonPythonModel:
    """QUESTION, K -> the K best passage IDS and their SCORES."""

    def initialize(self, args):
        """Index the corpus."""
        common, root = load_common(args)
        self.common = common
        self.index = common.Sparse(common.load_data(root))

    def execute(self, requests):
        """Search each request's question."""
        return self.common.respond_each(requests, self._search)

    def _search(self, request):
        question = self.common.strings(request, "QUESTION")[0]
        k = int(pb_utils.get_input_tensor_by_name(request, "K").as_numpy().reshape(-1)[0])
        return self.common.ranked_tensors(*self.index.search(question, k))

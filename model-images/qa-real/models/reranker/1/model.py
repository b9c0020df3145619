"""qa-real's reranker: orders candidates by their best sentence's MiniLM similarity."""

import importlib.util
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def load_common(args):
    """qa_common.py from the model repository's root (beside the data file) and that root."""
    root = os.path.dirname(args["model_repository"].rstrip("/"))
    spec = importlib.util.spec_from_file_location("qa_common", os.path.join(root, "qa_common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, root


def strings(request, name):
    """A string input as a list of str."""
    values = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


class TritonPythonModel:
    """QUESTION, IDS -> the same IDS best first, and their SCORES."""

    def initialize(self, args):
        """Load the corpus; sentences are embedded by the ``encoder`` model through BLS."""
        common, root = load_common(args)
        self.reranker = common.Reranker(common.load_data(root), common.triton_encoder())

    def execute(self, requests):
        """Rerank each request's candidates."""
        responses = []
        for request in requests:
            try:
                ids, scores = self.reranker.rerank(
                    strings(request, "QUESTION")[0], strings(request, "IDS")
                )
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("IDS", np.array([i.encode() for i in ids], np.object_)),
                            pb_utils.Tensor("SCORES", np.asarray(scores, dtype=np.float32)),
                        ]
                    )
                )
            # One bad request must fail alone.
            except Exception as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))))
        return responses

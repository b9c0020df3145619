"""qa-real's dense retriever: passage embeddings from the ``encoder`` model, cosine ranking."""

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
    """QUESTION, K -> the K best passage IDS and their SCORES."""

    def initialize(self, args):
        """Load the corpus; the passages are embedded (through BLS) on the first request."""
        common, root = load_common(args)
        self.index = common.Dense(common.load_data(root), common.triton_encoder())

    def execute(self, requests):
        """Search each request's question."""
        responses = []
        for request in requests:
            try:
                question = strings(request, "QUESTION")[0]
                k = int(pb_utils.get_input_tensor_by_name(request, "K").as_numpy().reshape(-1)[0])
                ids, scores = self.index.search(question, k)
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

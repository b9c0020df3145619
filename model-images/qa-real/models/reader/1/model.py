"""qa-real's reader, the final stage: the answer sentence and its score against the gold."""

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


def text_tensor(name, value):
    """A one-element string output."""
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


class TritonPythonModel:
    """QUESTION, IDS, MODE, SAMPLE -> ANSWER, PASSAGE, SCORE (1.0 when the answer is right)."""

    def initialize(self, args):
        """Load the corpus and the gold answers; MiniLM reading calls ``encoder`` through BLS."""
        self.common, root = load_common(args)
        self.data = self.common.load_data(root)
        self.reader = self.common.Reader(self.data, self.common.triton_encoder())

    def execute(self, requests):
        """Read each request's passages and grade the answer."""
        return self.common.respond_each(requests, self._read)

    def _read(self, request):
        strings = self.common.strings
        question = strings(request, "QUESTION")[0]
        mode = strings(request, "MODE")[0]
        sample = pb_utils.get_input_tensor_by_name(request, "SAMPLE").as_numpy()
        passage, answer = self.reader.read(question, strings(request, "IDS"), mode)
        gold = self.common.question_of(self.data, int(sample.reshape(-1)[0]))
        score = self.common.supports(gold, passage, answer)
        return [
            text_tensor("ANSWER", answer),
            text_tensor("PASSAGE", passage),
            pb_utils.Tensor("SCORE", np.array([score], dtype=np.float32)),
        ]

"""qa-real's reader, the final stage: the answer sentence and its score against the gold."""

import os
import sys

# qa_common.py sits at the model repository's root, three folders up from this file: Triton puts
# only the model's own folders on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import numpy as np
import qa_common
import triton_python_backend_utils as pb_utils


def text_tensor(name, value):
    """A one-element string output."""
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


class TritonPythonModel(qa_common.Component):
    """QUESTION, IDS, MODE, SAMPLE -> ANSWER, PASSAGE, SCORE (1.0 when the answer is right)."""

    def load(self):
        """Load the corpus and the gold answers; MiniLM reading calls ``encoder`` through BLS."""
        self.data = qa_common.load_data(self.root)
        self.reader = qa_common.Reader(self.data, qa_common.triton_encoder())

    def answer(self, request):
        """Read the request's passages and grade the answer."""
        strings = qa_common.strings
        question = strings(request, "QUESTION")[0]
        passage, answer = self.reader.read(
            question, strings(request, "IDS"), strings(request, "MODE")[0]
        )
        gold = qa_common.question_of(self.data, qa_common.integer(request, "SAMPLE"))
        score = qa_common.supports(gold, passage, answer)
        return [
            text_tensor("ANSWER", answer),
            text_tensor("PASSAGE", passage),
            pb_utils.Tensor("SCORE", np.array([score], dtype=np.float32)),
        ]

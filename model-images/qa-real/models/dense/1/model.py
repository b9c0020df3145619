"""qa-real's dense retriever: passage embeddings from the ``encoder`` model, cosine ranking."""

import os
import sys

# qa_common.py sits at the model repository's root, three folders up from this file: Triton puts
# only the model's own folders on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import qa_common


class TritonPythonModel(qa_common.Retriever):
    """QUESTION, K -> the K best passage IDS and their cosine SCORES."""

    def load(self):
        """Load the corpus; the passages are embedded (through BLS) on the first request."""
        self.index = qa_common.Dense(qa_common.load_data(self.root), qa_common.triton_encoder())

"""qa-real's sparse retriever: BM25 over the corpus (numpy only)."""

import os
import sys

# qa_common.py sits at the model repository's root, three folders up from this file: Triton puts
# only the model's own folders on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import qa_common


class TritonPythonModel(qa_common.Retriever):
    """QUESTION, K -> the K best passage IDS and their BM25 SCORES."""

    def load(self):
        """Index the corpus."""
        self.index = qa_common.Sparse(qa_common.load_data(self.root))

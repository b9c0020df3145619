"""qa-real's reranker: orders candidates by their best sentence's MiniLM similarity."""

import os
import sys

# qa_common.py sits at the model repository's root, three folders up from this file: Triton puts
# only the model's own folders on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import qa_common


class TritonPythonModel(qa_common.Component):
    """QUESTION, IDS -> the same IDS best first, and their SCORES."""

    def load(self):
        """Load the corpus; sentences are embedded by the ``encoder`` model through BLS."""
        self.reranker = qa_common.Reranker(
            qa_common.load_data(self.root), qa_common.triton_encoder()
        )

    def execute(self, requests):
        """Rerank the candidates of every request of the batch, with one encoder call."""
        strings = qa_common.strings
        return qa_common.respond_batch(
            requests,
            lambda request: (strings(request, "QUESTION")[0], strings(request, "IDS")),
            lambda queries: [
                qa_common.ranked_tensors(*ranked, batched=True)
                for ranked in self.reranker.rerank_many(queries)
            ],
        )

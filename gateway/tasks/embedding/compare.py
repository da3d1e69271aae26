"""A shadow candidate's embedding compared with the current model's (Task.compare): the
cosine similarity of the two vectors (1: the same direction; 0 when either is zero or their
lengths differ, which a candidate of another dimension gives), and whether they have the same
dimension."""

from __future__ import annotations

import numpy as np

from gateway.domain import Comparison
from gateway.tasks.embedding.nouns import Embedding


def compare_embeddings(current: Embedding, candidate: Embedding) -> Comparison:
    a = np.asarray(current.vector, np.float64)
    b = np.asarray(candidate.vector, np.float64)
    same = a.shape == b.shape
    cosine = 0.0
    if same and a.size:
        norms = float(np.linalg.norm(a) * np.linalg.norm(b))
        cosine = float(a @ b / norms) if norms > 0 else 0.0
    return Comparison(
        "embedding", {"cosine_similarity": cosine, "same_dimension": 1.0 if same else 0.0}
    )

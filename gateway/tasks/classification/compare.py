"""A shadow candidate's classes compared with the current model's (Task.compare): whether the
top-1 classes agree, and the overlap of the top-k classes (the classes both lists name over
the longer list's length; 1.0 when both are empty). Lists are at most top_k long (1,000)."""

from __future__ import annotations

from gateway.domain import Comparison
from gateway.tasks.classification.nouns import Classes


def compare_classes(current: Classes, candidate: Classes) -> Comparison:
    ours = [c.class_id if c.class_id >= 0 else c.label for c in current.classes]
    theirs = [c.class_id if c.class_id >= 0 else c.label for c in candidate.classes]
    top1 = (bool(ours) and bool(theirs) and ours[0] == theirs[0]) or (not ours and not theirs)
    longest = max(len(ours), len(theirs))
    overlap = len(set(ours) & set(theirs)) / longest if longest else 1.0
    return Comparison(
        "classification", {"top1_agreement": 1.0 if top1 else 0.0, "topk_overlap": overlap}
    )

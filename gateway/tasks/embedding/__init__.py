"""The embedding task: an image model's pooled feature output -> the image's vector
(L2-normalised unless the model config says normalize = false)."""

from gateway.tasks.embedding.task import EmbeddingPlan, EmbeddingTask

__all__ = ["TASK", "EmbeddingPlan", "EmbeddingTask"]

TASK = EmbeddingTask()

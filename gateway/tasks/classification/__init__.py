"""The classification task: a classifier's outputs -> classes ranked by score (`task`)."""

from gateway.tasks.classification.task import ClassificationSettings, ClassificationTask

__all__ = ["TASK", "ClassificationSettings", "ClassificationTask"]

TASK = ClassificationTask()

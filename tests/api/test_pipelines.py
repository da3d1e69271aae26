"""pipeline.v1 carries every built-in task's answer as a step's, and a detecting task's as the
first step's; a task it does not carry yet is named, so the gateway can refuse its pipeline
at startup instead of failing its answers."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.api.pipelines import uncarried
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.builtin import BUILT_IN, built_in_tasks

TASKS = built_in_tasks()


@pytest.mark.parametrize("task", TASKS.names)
def test_every_built_in_task_is_carried_where_it_can_stand(task):
    binding = BUILT_IN.for_task(task)
    assert uncarried(binding, first=False) == ""
    if TASKS[task].finds_instances:
        assert uncarried(binding, first=True) == ""
    else:
        assert uncarried(binding, first=True) == "pipeline.v1.PipelineResult.first"


def test_a_task_the_proto_does_not_carry_is_named():
    other = dataclasses.replace(BUILT_IN.for_task("detection"), result_type=tfs.PredictResponse)
    assert uncarried(other, first=False) == "pipeline.v1.StepResult.result"
    assert uncarried(other, first=True) == "pipeline.v1.PipelineResult.first"

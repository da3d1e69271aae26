"""A JobSpec knows no task's options: it carries them by name, its binding refuses a name
the task lacks (never dropped), and one read from a file must hold scalars."""

from __future__ import annotations

import pytest

from gateway.domain import ModelRef
from gateway.errors import GatewayError, Kind
from gateway.jobs.spec import JobSpec
from gateway.tasks.builtin import BUILT_IN

STORED = {
    "input": "/data",
    "output": "/out",
    "format": "auto",
    "task": "detection",
    "model": ModelRef("detector")._asdict(),
    "options": {"min_score": 0.5},
    "shards": 1,
}


def test_a_spec_round_trips_and_its_options_are_its_tasks() -> None:
    spec = JobSpec.from_json(STORED)
    assert spec.to_json() == STORED
    assert spec.binding(BUILT_IN).verb == "detect"
    spec.check()  # the values are the task's to judge, not the spec's
    JobSpec.from_json({**STORED, "options": {"min_score": 2.0}}).check()


def test_a_spec_read_from_a_file_with_another_tasks_option_is_refused_by_name() -> None:
    spec = JobSpec.from_json({**STORED, "options": {"top_k": 3}})
    with pytest.raises(GatewayError) as info:
        spec.binding(BUILT_IN)
    assert info.value.kind == Kind.INVALID_INPUT
    assert info.value.message == (
        "top_k is not an option of task detect (its options: min_score, max_detections)"
    )
    with pytest.raises(GatewayError, match="options"):
        JobSpec.from_json({**STORED, "options": {"max_detections": "many"}}).binding(BUILT_IN)


@pytest.mark.parametrize("options", [None, [], {"min_score": [0.5]}, {"min_score": None}])
def test_a_spec_file_whose_options_are_not_scalars_is_no_spec(options: object) -> None:
    with pytest.raises(ValueError, match="not a job spec"):
        JobSpec.from_json({**STORED, "options": options})

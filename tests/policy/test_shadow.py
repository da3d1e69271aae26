"""Shadow calls run after the caller's answer, bounded: dropped and counted when too many are
pending or the gateway is near its limit; a failing candidate is counted, never raised; the
task's comparison runs in a thread of its own, off the event loop."""

from __future__ import annotations

import asyncio
import threading

from gateway import errors
from gateway.domain import ModelRef, Outcome
from gateway.models import ModelConfig, ModelRegistry
from gateway.models.rollout import RolloutConfig, Target
from gateway.policy.rollout import ModelRollout, Rollouts
from gateway.policy.shadow import Shadows
from gateway.tasks.builtin import built_in_tasks
from gateway.tasks.detection.nouns import Box, Detection, Detections, NormalizedBox

COMPARE = built_in_tasks()["detection"].compare


def rollout() -> ModelRollout:
    shadow = RolloutConfig(shadow=Target(version=2), share=1.0)
    config = ModelConfig("m", "detection", rollout=shadow)
    return Rollouts(ModelRegistry({"m": config}, "m", {}, "detection")).models["m"]


def outcome(*scores: float) -> Outcome:
    boxes = [
        Detection(1, "cat", s, Box(0, 0, 10, 10), NormalizedBox(0, 0, 0.5, 0.5)) for s in scores
    ]
    return Outcome(Detections(boxes), 20, 20, "m", 1, "id", {})


def test_a_copy_is_compared_after_the_caller_goes_on():
    async def main() -> None:
        shadows = Shadows(64, lambda: 0)
        shadowed = rollout()
        started = asyncio.Event()

        async def call() -> Outcome:
            started.set()
            return outcome(0.5)

        threads: list[int] = []

        def compare(current: object, candidate: object):  # type: ignore[no-untyped-def]
            threads.append(threading.get_ident())
            return COMPARE(current, candidate)

        shadows.send(shadowed, outcome(0.9), call, compare)
        assert not started.is_set()  # nothing ran before the caller's turn ends
        await shadows.drain()
        assert shadowed.counts["sent"] == 1
        assert shadowed.compared["detection"]["images"] == 1
        assert shadowed.compared["detection"]["deltas"] == -0.4
        assert threads and threads[0] != threading.get_ident()  # not on the event loop
        shadows.close()

    asyncio.run(main())


def test_copies_beyond_the_cap_or_near_the_limit_are_dropped_and_counted():
    async def main() -> None:
        in_flight = [0]
        shadows = Shadows(8, lambda: in_flight[0], max_pending=2)
        shadowed = rollout()
        gate = asyncio.Event()

        async def held() -> Outcome:
            await gate.wait()
            return outcome(0.9)

        for _ in range(3):
            shadows.send(shadowed, outcome(0.9), held, COMPARE)
        assert (shadows.pending, shadowed.counts["dropped"]) == (2, 1)
        gate.set()
        await shadows.drain()
        in_flight[0] = 6  # three quarters of 8
        shadows.send(shadowed, outcome(0.9), held, COMPARE)
        assert (shadows.pending, shadowed.counts["dropped"]) == (0, 2)
        in_flight[0] = 5
        shadows.send(shadowed, outcome(0.9), held, COMPARE)
        await shadows.drain()
        assert (shadowed.counts["sent"], shadowed.compared["detection"]["images"]) == (3, 3)

    asyncio.run(main())


def test_a_failing_candidate_is_counted_and_goes_no_further():
    async def main() -> None:
        shadows = Shadows(64, lambda: 0)
        shadowed = rollout()

        async def failing() -> Outcome:
            raise errors.GatewayError(errors.Kind.UNAVAILABLE, "TF Serving is unavailable")

        shadows.send(shadowed, outcome(0.9), failing, COMPARE)
        await shadows.drain()
        assert (shadowed.counts["sent"], shadowed.counts["failed"]) == (1, 1)
        assert "detection" not in shadowed.compared

    asyncio.run(main())


def test_the_shadow_model_ref_is_the_candidate():
    assert rollout().shadow == ModelRef("m", 2)

"""How many images one coalesced Predict may hold, and what a refused batch says.

TF Serving (or what stands in front of it) refuses a whole batch for one of three reasons,
and each asks for something else (the texts are TF Serving's and TensorFlow's, recorded in
serving/local/FACTS.md):

- **its size** (`batch_too_large`: INVALID_ARGUMENT `Task size <n> is larger than maximum
  input batch size <max>` from a batching TF Serving; `tensor_oom`: RESOURCE_EXHAUSTED `OOM
  when allocating tensor with shape...` when the batch does not fit the device's memory;
  `Received message larger than max` / `Sent message larger than max` from a gRPC message
  limit on the way): smaller batches go through. The batch is sent again in two halves, and
  the queue's limit drops to the half.
- **one image** it cannot take (another INVALID_ARGUMENT or OUT_OF_RANGE): the batch is sent
  again in halves, down to the image, which fails alone. When every half is then answered,
  the batch's size was the cause after all, and the limit drops as for a size refusal.
- **load** (`batch_queue_full`: UNAVAILABLE `The batch scheduling queue to which this task
  was submitted is full`; `grpc_thread_quota`: RESOURCE_EXHAUSTED with no message when TF
  Serving's gRPC threads are used up; any other RESOURCE_EXHAUSTED): the batch is not sent
  again, not as one call and not as many (more calls into an overloaded server only deepen
  its queue). Its images are answered OVERLOADED (UNAVAILABLE for a full queue) with a
  retry delay, and the limit stays: load says nothing about the size a batch may have.

A lowered limit grows back: after `GROW_AFTER` full batches at the limit it doubles, up to
the model's max_batch. Where a size was refused, growing to it again waits `hold` seconds
(30 s, doubled by each refusal up to 10 min, back to 30 s once a grown batch is answered), so
a server whose own ceiling is below max_batch costs one refused call per hold, not one per
batch, and a server that was short of memory once gets its batches back.
"""

from __future__ import annotations

from gateway.errors import GatewayError, Kind

# Refusals of a batch for its size (serving/local/FACTS.md: batch_too_large, tensor_oom;
# gRPC's message limits).
SIZE_MARKERS = (
    "is larger than maximum input batch size",
    "is larger than maximum batch size",  # TensorFlow before 2.5
    "OOM when allocating tensor",
    "Received message larger than max",
    "Sent message larger than max",
)
SIZE, IMAGE, LOAD, OTHER = "size", "image", "load", "other"
# Full batches at a lowered limit before it doubles.
GROW_AFTER = 16
# Seconds before a batch as large as a refused one is tried again: the first wait, the cap.
HOLD_MIN = 30.0
HOLD_MAX = 600.0
# The retry delay an overloaded answer carries (RetryInfo / Retry-After at the doors): about
# the longest backoff between two attempts of one call (gateway.upstream.retries).
RETRY_AFTER = 1.0


def refusal(error: GatewayError) -> str:
    """Why TF Serving refused a batch: SIZE, IMAGE (maybe one image), LOAD or OTHER."""
    if any(marker in error.message for marker in SIZE_MARKERS):
        return SIZE
    if error.kind in (Kind.INVALID_INPUT, Kind.OUT_OF_RANGE):
        return IMAGE
    if error.kind in (Kind.OVERLOADED, Kind.UNAVAILABLE):
        return LOAD
    return OTHER


def advised(error: GatewayError) -> GatewayError:
    """A LOAD refusal as its images get it: not sent again, with a retry delay."""
    if error.retry_after is not None:
        return error
    return GatewayError(
        error.kind,
        f"{error.message} (not sent again: retry after {RETRY_AFTER:g} s)",
        RETRY_AFTER,
    )


class BatchLimit:
    """The images per call of one queue: `limit`, between 1 and `max_batch`."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self.limit = max_batch
        self.refused: int | None = None  # the smallest batch refused for its size, if held
        self.hold = HOLD_MIN
        self.hold_until = 0.0
        self.full = 0  # full batches answered at the limit since it last changed
        self.probing = False  # the limit grew back to (or past) a refused size

    def too_large(self, count: int, now: float) -> None:
        """A batch of `count` images was refused for its size (or only went in halves)."""
        self.limit = max(1, min(self.limit, (count + 1) // 2))
        self.refused = count if self.refused is None else min(self.refused, count)
        if now >= self.hold_until:  # not while holding: the halves of one refusal count once
            self.hold_until = now + self.hold
            self.hold = min(self.hold * 2, HOLD_MAX)
        self.full = 0
        self.probing = False

    def answered(self, count: int, now: float) -> None:
        """A batch of `count` images was answered."""
        if count < self.limit:
            return
        if self.probing:  # the size refused before goes through again
            self.hold, self.probing = HOLD_MIN, False
        self.full += 1
        if self.full < GROW_AFTER or self.limit >= self.max_batch:
            return
        grown = min(self.max_batch, self.limit * 2)
        if self.refused is not None and grown >= self.refused:
            if now < self.hold_until:
                return
            self.refused, self.probing = None, True
        self.limit, self.full = grown, 0

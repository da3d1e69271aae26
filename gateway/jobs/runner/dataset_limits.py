"""What the runner may read of a dataset, checked before the bytes are read: the size of one
image, one manifest line and one TFRecord record (from GATEWAY_MAX_IMAGE_BYTES), the bytes a
compressed input file may inflate to, the input files of a job and the manifest lines and
TFRecord records it reads.

Each refusal names the limit and the setting that raises it. Over the image limit is that
item's error (TOO_LARGE, as online); over a job's limit ends the job (`LimitExceeded`,
RESOURCE_EXHAUSTED): the input is not a dataset this gateway takes in one job.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import GatewayError, Kind

MIB = 1024 * 1024
# Room in one line or record besides the image: ids, labels and other metadata.
METADATA_ROOM = 1 * MIB


class LimitExceeded(Exception):
    """The job reads more than its limits allow; the message names the limit and setting."""

    def error(self) -> GatewayError:
        return GatewayError(Kind.OVERLOADED, str(self))


@dataclass(frozen=True)
class Limits:
    max_image_bytes: int = 32 * MIB
    max_items: int = 1_000_000
    max_input_files: int = 100_000
    max_decompressed_bytes: int = 4096 * MIB
    # The setting that sets max_items for this job (an upload's images per upload bound it).
    items_setting: str = "GATEWAY_BATCH_MAX_ITEMS_PER_JOB"

    @property
    def max_line_bytes(self) -> int:
        """A manifest line: the largest image as base64, plus metadata."""
        return 4 * -(-self.max_image_bytes // 3) + METADATA_ROOM

    @property
    def max_record_bytes(self) -> int:
        """A TFRecord record: a tf.Example with the largest image, plus metadata."""
        return self.max_image_bytes + METADATA_ROOM

    def flags(self) -> list[str]:
        """The limits as `detection-batch` flags (the kubernetes executor's pods)."""
        return [
            f"--max-image-bytes={self.max_image_bytes}",
            f"--max-items={self.max_items}",
            f"--max-input-files={self.max_input_files}",
            f"--max-decompressed-bytes={self.max_decompressed_bytes}",
        ]

    def image_too_large(self, size: int | None, what: str) -> GatewayError:
        shown = f"{size} bytes" if size is not None else f"over {self.max_image_bytes} bytes"
        return GatewayError(
            Kind.TOO_LARGE,
            f"{what} is {shown}; the limit for one image is {self.max_image_bytes} bytes "
            "(GATEWAY_MAX_IMAGE_BYTES): it was not read",
        )

    def line_too_long(self, number: int) -> str:
        return (
            f"line {number} is longer than {self.max_line_bytes} bytes, the limit for one "
            "manifest line (the largest image, GATEWAY_MAX_IMAGE_BYTES, as base64 plus 1 MiB "
            "of metadata): it was skipped unread"
        )

    def too_many_items(self, url: str) -> LimitExceeded:
        return LimitExceeded(
            f"the job reads more than {self.max_items} manifest lines and TFRecord records "
            f"(at {url}), its limit ({self.items_setting}); split the dataset into several "
            "jobs or raise the setting"
        )

    def too_many_files(self, url: str) -> LimitExceeded:
        return LimitExceeded(
            f"INPUT {url} holds more than {self.max_input_files} files, the limit for one job "
            "(GATEWAY_BATCH_MAX_INPUT_FILES); split the dataset into several jobs or raise "
            "the setting"
        )

    def inflates_too_much(self, url: str) -> LimitExceeded:
        return LimitExceeded(
            f"{url} decompresses to more than {self.max_decompressed_bytes} bytes, the limit "
            "for one input file (GATEWAY_BATCH_MAX_DECOMPRESSED_BYTES); it was not read "
            "further"
        )


class ItemCount:
    """Manifest lines and TFRecord records a job has read, against its limit (shared by its
    shards when one process runs them)."""

    def __init__(self, limits: Limits, already: int = 0) -> None:
        self.limits = limits
        self.read = already

    def take(self, url: str, count: int = 1) -> None:
        self.read += count
        if self.read > self.limits.max_items:
            raise self.limits.too_many_items(url)

"""`python -m gateway` / `detection-gateway`: run the gateway."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from gateway import logs
from gateway.app import serve
from gateway.flags import parse_settings
from gateway.labels import LabelsError
from gateway.models import ModelConfigError
from gateway.workers import supervise


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    logs.setup(settings.log_level)
    if settings.workers > 1:
        args = sys.argv[1:] if argv is None else list(argv)
        sys.exit(supervise(settings, args))
    try:
        asyncio.run(serve(settings))
    except (LabelsError, ModelConfigError) as exc:
        sys.exit(f"gateway: {exc}")
    except (OSError, RuntimeError) as exc:  # grpc raises RuntimeError when it cannot bind
        sys.exit(f"gateway: cannot start: {exc}")


if __name__ == "__main__":
    main()

"""`python -m gateway` / `detection-gateway`: run the gateway.

`python -m gateway check-models [--json] [flags]`: show the plan for every configured model
(gateway.modelcheck); exit status 1 when one cannot be served."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from gateway import logs, modelcheck
from gateway.app import load_models, serve
from gateway.flags import parse_settings
from gateway.identity import AdminsError
from gateway.jobs.runner.access import PlacesError
from gateway.labels import LabelsError
from gateway.models import ModelConfigError
from gateway.paylog.sampling import PaylogError
from gateway.policy.quotas import QuotaError
from gateway.tasks.builtin import built_in_tasks
from gateway.workers import supervise


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["check-models"]:
        sys.exit(check_models(args[1:]))
    settings = parse_settings(argv)
    logs.setup(settings.log_level)
    if settings.workers > 1:
        args = sys.argv[1:] if argv is None else list(argv)
        sys.exit(supervise(settings, args))
    try:
        asyncio.run(serve(settings))
    except (LabelsError, ModelConfigError, PlacesError, AdminsError, QuotaError,
            PaylogError) as exc:  # fmt: skip
        sys.exit(f"gateway: {exc}")
    except (OSError, RuntimeError) as exc:  # grpc raises RuntimeError when it cannot bind
        sys.exit(f"gateway: cannot start: {exc}")


def check_models(args: Sequence[str]) -> int:
    as_json = "--json" in args
    settings = parse_settings([a for a in args if a != "--json"])
    logs.setup("WARNING")
    tasks = built_in_tasks()
    try:
        registry = load_models(settings, tasks)
    except (LabelsError, ModelConfigError) as exc:
        print(f"gateway check-models: {exc}", file=sys.stderr)
        return 1
    return modelcheck.report(settings, registry, tasks, as_json)


if __name__ == "__main__":
    main()

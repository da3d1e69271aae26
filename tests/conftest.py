"""Shared fixtures (the reference SavedModels, from the export cache of tests/support/models.py,
and one local TF Serving with them for the whole run), the markers given by place (everything
under tests/e2e is `e2e`) and the run's last line: what was skipped and why (under CI=1 a
missing tool fails instead: tests/support/tools.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import models
from tests.support.localserver import LocalServer, run_local_server

# The run's last line: what was skipped and why (tests/support/skipsummary.py); the
# session's `make run` (the `make_run` fixture, tests/support/makerun.py); how `make test`'s
# two workers share the directories (tests/support/workers.py).
pytest_plugins = ["tests.support.skipsummary", "tests.support.makerun", "tests.support.workers"]

TESTS = Path(__file__).parent
E2E = TESTS / "e2e"
# `slow` by place: the files whose tests start processes (gateways, TF Serving, batch runners,
# forked servers) or run TensorFlow, measured from the per-test durations (setup + call +
# teardown) of a whole run on 2 shared cores (2026-11-26, load 8 to 14), with the seconds each
# file took there. `pytest -m "not slow"` (`make test-fast`) runs the rest, under 3 minutes; a
# slow test in another file carries `@pytest.mark.slow` itself. Re-measure when a file grows.
# The parts of a file split by subject (issue 36.6) carry the seconds each took in a run of
# those parts alone (2026-11-26, load 2 to 4).
SLOW = {
    "e2e": 210,  # every file: 33 (trace headers) to 210 s (lifecycle)
    "zoo": 1500,  # exports and serves the zoo: minutes
    "bench": 900,  # the smoke runs of each benchmark (issue 36: 900-1300 s)
    "jobs/runner/test_e2e.py": 113,
    "jobs/runner/test_s3.py": 88,
    "jobs/runner/test_kill.py": 83,
    "reliability/test_faults.py": 134,
    "reliability/test_shutdown.py": 130,
    "reliability/test_broken_answers.py": 73,
    "reliability/test_upstream_calls.py": 27,
    "reliability/test_fuzz.py": 13,
    "reliability/test_hostile_input.py": 59,
    # The first of these starts the HTTP door's TF Serving and gateway (a session fixture),
    # which the others then share: alone, each pays for it.
    "frontends/http/test_http_api.py": 120,
    "frontends/http/test_http_formats.py": 15,
    "frontends/http/test_http_errors.py": 6,
    "frontends/http/test_http_faults.py": 57,
    "frontends/http/test_jobs_http.py": 23,
    "frontends/http/test_jobs_http_callers.py": 7,
    "frontends/http/test_jobs_http_page.py": 6,
    # Alone in the quick loop each of these two starts the door's gateway and TF Serving.
    "frontends/http/test_http_browser.py": 89,
    "frontends/http/test_http_client.py": 145,
    "security/test_jobs_access.py": 14,
    "security/test_jobs_storage.py": 7,
    "security/test_grpc_limits.py": 61,
    "security/test_tls_and_hardening.py": 48,
    "security/test_hostile_bodies.py": 15,
    "security/test_identity_forgery.py": 59,
    "security/test_job_places.py": 33,
    "security/test_jobs_door_edges.py": 17,
    "k8s/test_tls.py": 12,
    "k8s/test_validate.py": 11,
    "paylog/test_replay_doors.py": 25,  # gateways, the local TF Serving, batch runners
    "paylog/test_callers_doors.py": 11,
    "jobs/control/test_grpcurl.py": 43,
    "jobs/control/test_flow.py": 39,
    "jobs/control/test_replicas.py": 28,
    "jobs/executors/test_lifecycle.py": 10,
    "jobs/control/test_races.py": 100,  # two gateways per test, 400-image jobs (load 20)
    "jobs/control/test_edges.py": 53,  # a TF Serving and an in-process job service per test
    "serving/test_detector.py": 133,
    "serving/test_export.py": 98,
    "serving/wire": 16,  # one local TF Serving for the package (conftest.py)
    "serving/test_local_versions.py": 43,
    "serving/test_local_config.py": 22,
    "serving/test_reference_models.py": 121,
    "serving/test_unparsable_input.py": 36,
    # Process-heavy files the quick loop still ran, from `python -m tests.support.suitetime
    # --fast` (2026-11-29, load 13.8; bench/results.md#suite-fast): the seconds of their tests
    # that the section lists among the slowest. Each starts gateways (and TF Serving, chromium).
    "frontends/http/test_page_tasks.py": 270,  # two TF Servings, gateways, chromium
    "jobs/control/test_job_slots.py": 101,  # two gateways racing on one store
    "jobs/spec/test_task_options.py": 88,  # a TF Serving of its own and a gateway
    "jobs/executors/test_poison.py": 100,  # runners killed and out of memory
    "security/test_hostile_datasets.py": 57,
    "jobs/executors/test_lease_fence.py": 41,
    "jobs/control/test_store_budget.py": 38,
    # The quick loop's JUnit XML (2026-11-29 16:10 UTC, load 3-4): the three files that kept
    # it over 3 minutes (issue 43), each starting gateways against the API server or chromium.
    "k8s/test_jobs_cluster.py": 43,  # a gateway, its sidecar, moto and two runner pods
    "frontends/http/test_page_pipelines.py": 31,  # chromium and make run's pipeline
    "jobs/executors/test_kube.py": 37,  # the kubernetes executor on the API server
}


def is_slow(path: Path) -> bool:
    where = path.relative_to(TESTS).as_posix()
    return any(where == place or where.startswith(f"{place}/") for place in SLOW)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The quick loop (`-m "not slow"`) does not even import the slow files (TensorFlow and
    the process harnesses among them): collecting them costs seconds for nothing."""
    inside = collection_path.is_relative_to(TESTS) and collection_path != TESTS
    if config.getoption("markexpr", "") == "not slow" and inside and is_slow(collection_path):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
        if item.path.is_relative_to(TESTS) and is_slow(item.path):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with version 1 of every reference model (serving.reference:
    four detectors, three classifiers), copied from the export cache (tests/support/models.py;
    exported there first when the cache has none for the current sources).

    Layout: <repo>/<model name>/1/ (SavedModel, assets.extra/ with warmup and label_map.pbtxt
    or labels.txt).
    """
    return models.copy_to(tmp_path_factory.mktemp("models"))


# What the shared TF Serving serves: the reference models its users call (make run's, one per
# task and the detectors' and classifiers' input forms; tests/e2e/test_door_matrix.py).
SHARED_MODELS = (
    "detector",
    "detector_fixed",
    "detector_float",
    "classifier",
    "classifier_logits",
    "classifier_scores",
    "maskrcnn",
    "pose",
    "embedder",
)


@pytest.fixture(scope="session")
def reference_serving(
    model_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """One local TF Serving with version 1 of SHARED_MODELS, started once for the run and
    shared by the modules that only send it Predicts (the `tfs` of tests/jobs,
    tests/jobs/runner, tests/reliability, tests/security, the doors' tests of tests/paylog
    and tests/policy, tests/test_metrics_per_model.py, tests/e2e/test_classification.py):
    each start imports TensorFlow and loads its models,
    about 13 CPU-s. A test that stops, restarts or reads the log of its TF Serving, or serves
    models or flags of its own, starts its own.
    """
    directory = tmp_path_factory.mktemp("reference-serving")
    entries = "".join(
        f"  config {{ name: '{n}' base_path: '{model_repo / n}' model_platform: 'tensorflow' }}\n"
        for n in SHARED_MODELS
    )
    config = directory / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={config}"], log_dir=directory) as server:
        yield server

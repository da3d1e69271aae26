"""Model versions: config, base-path polling, load/unload, version states and labels.

The local counterpart of TF Serving's ServerCore + AspiredVersionsManager +
ServableStateMonitor: a config names models and base paths; each poll turns directories
into aspired versions (`versions.py`), versions are loaded (with retries and warmup) and
unloaded one at a time, requests borrow a loaded version through `servable()` (which one:
`labels.py`), and every state change is recorded for GetModelStatus.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message
from tensorflow_serving.apis import get_model_status_pb2, model_pb2

from serving.local import labels, versions
from serving.local.config import ModelConfig, SessionSettings, check_allowed_batch_sizes
from serving.local.errors import ServingError, from_exception, invalid_argument
from serving.local.servable import Servable
from serving.local.versions import Action, Harness
from serving.local.warmup import run_warmup

log = logging.getLogger(__name__)

State = get_model_status_pb2.ModelVersionStatus.State
# Versions that are no longer aspired leave the manager at once in these states.
_DROPPABLE = (Harness.NEW, Harness.ERROR, Harness.DISABLED)


@dataclass(frozen=True)
class ManagerSettings:
    """What the manager takes from the flags."""

    session: SessionSettings
    file_system_poll_wait_seconds: int = 1
    enable_model_warmup: bool = True
    num_request_iterations_for_warmup: int = 0
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    allow_version_labels_for_unavailable_models: bool = False
    check_method_name: bool = False
    batching: Message | None = None


@dataclass(frozen=True)
class VersionStatus:
    """A version's state as GetModelStatus reports it (ServableStateMonitor)."""

    state: int
    error: ServingError | None = None


@dataclass
class _Version:
    version: int
    path: str
    aspired: bool = True
    state: Harness = Harness.NEW
    servable: Servable | None = None
    in_use: int = 0


@dataclass
class _Model:
    config: ModelConfig | None  # None: removed from the config, versions still unloading
    versions: dict[int, _Version] = field(default_factory=dict)


class Stopped(Exception):
    """The manager was stopped while waiting."""


def servable_id(name: str, version: int) -> str:
    """ServableId::DebugString."""
    return f"{{name: {name} version: {version}}}"


class ModelManager:
    """Owns every loaded version; thread-safe."""

    def __init__(self, settings: ManagerSettings) -> None:
        self._settings = settings
        self._cond = threading.Condition()  # guards the state below
        self._models: dict[str, _Model] = {}
        self._labels: labels.Labels = {}
        self._states: dict[str, dict[int, VersionStatus]] = {}
        self._update_lock = threading.RLock()  # one config reload or poll at a time
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None

    # ----- configuration and polling -------------------------------------------------------

    def reload_config(self, configs: list[ModelConfig]) -> None:
        """ServerCore::ReloadConfig: labels first, then models; waits for new models to load.

        Raises ServingError (FAILED_PRECONDITION for labels on unavailable versions, UNKNOWN
        when a new model did not become available).
        """
        with self._update_lock:
            labels = self._label_map(configs)
            with self._cond:
                new_models = [c.name for c in configs if c.name not in self._models]
                self._labels = labels
                wanted = {c.name for c in configs}
                for name, model in self._models.items():
                    if name not in wanted:
                        model.config = None
                for config in configs:
                    self._models.setdefault(config.name, _Model(config)).config = config
            if self._settings.file_system_poll_wait_seconds >= 0:  # negative: never poll (TFS)
                self.poll()
            self._await_available(new_models)

    def poll(self) -> None:
        """Scans every base path once and loads/unloads versions to match the policies."""
        with self._update_lock:
            with self._cond:
                models = {name: model.config for name, model in self._models.items()}
            try:
                aspired = {
                    name: versions.aspired_versions(config) if config else {}
                    for name, config in models.items()
                }
            except ServingError as exc:
                log.error(
                    "FileSystemStoragePathSource encountered a filesystem access error: %s",
                    exc.message,
                )
                return
            for name, wanted in aspired.items():
                self._set_aspired(name, wanted)
                self._reconcile(name)

    def start_polling(self) -> None:
        """Polls every --file_system_poll_wait_seconds (TF Serving: 0 polls once, <0 never)."""
        period = self._settings.file_system_poll_wait_seconds
        if period <= 0:
            return
        self._poller = threading.Thread(
            target=self._poll_forever, args=(period,), name="fs-poll", daemon=True
        )
        self._poller.start()

    def interrupt(self) -> None:
        """Ends waits (startup, load retries, polling) without unloading anything yet."""
        self._stopping.set()

    def stop(self) -> None:
        """Stops polling and unloads every version."""
        self._stopping.set()
        if self._poller is not None:
            self._poller.join()
        with self._update_lock:
            log.info("Unload all remaining servables in the manager.")
            with self._cond:
                loaded = [
                    (name, v.version)
                    for name, model in self._models.items()
                    for v in model.versions.values()
                    if v.state is Harness.READY
                ]
            for name, version in loaded:
                self._unload(name, version)

    # ----- requests ------------------------------------------------------------------------

    @contextmanager
    def servable(self, spec: model_pb2.ModelSpec) -> Iterator[Servable]:
        """Borrows the version a ModelSpec names (ServerCore::GetServableHandle)."""
        if not spec.name:
            raise invalid_argument("ModelSpec has no name specified.")
        with self._cond:
            entry = self._resolve(spec)
            entry.in_use += 1
        try:
            assert entry.servable is not None
            yield entry.servable
        finally:
            with self._cond:
                entry.in_use -= 1
                self._cond.notify_all()

    def version_states(self, name: str) -> dict[int, VersionStatus]:
        """Every version ever seen for the model, newest first."""
        with self._cond:
            states = self._states.get(name, {})
            return {v: states[v] for v in sorted(states, reverse=True)}

    # ----- internals -----------------------------------------------------------------------

    def _resolve(self, spec: model_pb2.ModelSpec) -> _Version:
        model = self._models.get(spec.name)
        loaded = {
            v.version: v
            for v in (model.versions.values() if model else ())
            if v.state is Harness.READY
        }
        return loaded[labels.chosen_version(spec, loaded, self._labels)]

    def _label_map(self, configs: list[ModelConfig]) -> labels.Labels:
        """ServerCore::UpdateModelVersionLabelMap against the current version states."""
        with self._cond:
            return labels.label_map(
                configs,
                self._labels,
                self._is_available,
                self._settings.allow_version_labels_for_unavailable_models,
            )

    def _is_available(self, name: str, version: int) -> bool:
        status = self._states.get(name, {}).get(version)
        return status is not None and status.state == State.AVAILABLE

    def _set_aspired(self, name: str, wanted: dict[int, str]) -> None:
        with self._cond:
            model = self._models[name]
            for version, entry in list(model.versions.items()):
                entry.aspired = version in wanted
                if not entry.aspired and entry.state in _DROPPABLE:
                    del model.versions[version]
                    if entry.state is Harness.NEW:
                        self._publish(name, version, State.END)
            for version, path in wanted.items():
                if version not in model.versions:
                    model.versions[version] = _Version(version, path)
                    self._publish(name, version, State.START)
            if model.config is None and not model.versions:
                del self._models[name]

    def _reconcile(self, name: str) -> None:
        while not self._stopping.is_set():
            with self._cond:
                model = self._models.get(name)
                if model is None:
                    return
                action = versions.next_action(
                    versions.VersionSnapshot(v.version, v.aspired, v.state)
                    for v in model.versions.values()
                )
            if action is None:
                return
            kind, version = action
            if kind is Action.LOAD:
                self._load(name, version)
            else:
                self._unload(name, version)

    def _load(self, name: str, version: int) -> None:
        with self._cond:
            entry = self._models[name].versions[version]
            entry.state = Harness.LOADING
            self._publish(name, version, State.LOADING)
        log.info("Loading servable version %s from %s", servable_id(name, version), entry.path)
        try:
            servable = self._load_with_retries(name, version, entry.path)
        except ServingError as exc:
            log.error(
                "Encountered an error for servable version %s: %s", servable_id(name, version), exc
            )
            with self._cond:
                entry.state = Harness.ERROR
                self._publish(name, version, State.END, exc)
            return
        with self._cond:
            entry.servable = servable
            entry.state = Harness.READY
            self._publish(name, version, State.AVAILABLE)
        log.info("Successfully loaded servable version %s", servable_id(name, version))

    def _load_with_retries(self, name: str, version: int, path: str) -> Servable:
        """LoaderHarness::Load: the first try plus --max_num_load_retries retries."""
        description = f"Loading servable: {servable_id(name, version)}"
        retries = max(self._settings.max_num_load_retries, 0)
        interval = max(self._settings.load_retry_interval_micros, 0) / 1e6
        error = ServingError(grpc.StatusCode.CANCELLED, "Loading of servable cancelled")
        for attempt in range(retries + 1):
            if attempt:
                if self._stopping.wait(interval):
                    break
                log.info("Retrying of %s retry: %d", description, attempt)
            try:
                return self._load_once(name, version, path)
            except Exception as exc:
                error = from_exception(exc)
                log.error("%s failed: %s", description, error)
        else:
            if retries:
                log.info("Retrying of %s exhausted max_num_retries: %d", description, retries)
        raise error

    def _load_once(self, name: str, version: int, path: str) -> Servable:
        if self._settings.batching is not None:
            check_allowed_batch_sizes(self._settings.batching)
        servable = Servable(name, version, path, self._settings.session)
        try:
            if self._settings.enable_model_warmup:
                run_warmup(
                    servable,
                    self._settings.num_request_iterations_for_warmup,
                    self._settings.check_method_name,
                )
        except BaseException:
            servable.close()
            raise
        return servable

    def _unload(self, name: str, version: int) -> None:
        """Stops new requests, waits for running ones, then closes the session."""
        with self._cond:
            entry = self._models[name].versions[version]
            entry.state = Harness.UNLOADING
            self._publish(name, version, State.UNLOADING)
            self._cond.wait_for(lambda: entry.in_use == 0)
            servable, entry.servable = entry.servable, None
        if servable is not None:
            servable.close()
        with self._cond:
            entry.state = Harness.DISABLED
            self._publish(name, version, State.END)
            model = self._models[name]
            if not entry.aspired:
                del model.versions[version]
            if model.config is None and not model.versions:
                del self._models[name]
        log.info("Done unloading servable version %s", servable_id(name, version))

    def _publish(
        self, name: str, version: int, state: int, error: ServingError | None = None
    ) -> None:
        self._states.setdefault(name, {})[version] = VersionStatus(state, error)

    def _await_available(self, names: list[str]) -> None:
        """ServerCore::WaitUntilModelsAvailable: each model's newest settled version.

        A model is settled once a version is AVAILABLE or END; until then (no version
        directory yet) the base paths are polled again, forever, like TF Serving.
        """
        while True:
            settled = {name: self._newest_settled(name) for name in names}
            if all(settled.values()):
                break
            period = self._settings.file_system_poll_wait_seconds
            if self._stopping.wait(period if period > 0 else None):
                raise Stopped()
            if period > 0:
                self.poll()
        failed = []
        for name, newest in settled.items():
            assert newest is not None
            version, status = newest
            if status.state != State.AVAILABLE:
                due = f" due to error: {status.error}" if status.error else ""
                failed.append(f"{{{servable_id(name, version)}{due}}}, ")
        if failed:
            raise ServingError(
                grpc.StatusCode.UNKNOWN,
                f"{len(failed)} model(s) did not become available: {{{''.join(failed)}}}",
            )

    def _newest_settled(self, name: str) -> tuple[int, VersionStatus] | None:
        for version, status in self.version_states(name).items():
            if status.state in (State.AVAILABLE, State.END):
                return version, status
        return None

    def _poll_forever(self, period: int) -> None:
        while not self._stopping.wait(period):
            try:
                self.poll()
            except Exception:  # keep polling; TF Serving's poller logs and carries on
                log.exception("File-system poll failed")

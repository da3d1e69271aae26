"""Where batch jobs over the API run in each render, and what that needs: components/jobs
(the `kubernetes` executor, a job store on object storage every replica shares, the runner
pods' identity and credentials), the local store of the other overlays on a volume sized from
GATEWAY_JOB_STORE_MAX_BYTES, and an image that holds what the chosen executor and store load.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from importlib import metadata
from pathlib import Path, PurePosixPath

import fsspec.core
import pytest
from fsspec.registry import known_implementations

from tests.support.dockerimage import closure, image_distributions
from tests.support.dryrun import render as render_kustomization
from tests.support.renders import (
    GATEWAY,
    ROOT,
    TARGETS,
    Obj,
    container,
    env_of,
    find,
    gateway_settings,
    of_kind,
    parse_quantity,
    pod_spec,
    rendered,
)

OVERLAYS = [t for t in TARGETS if t != "base"]
MIB = 1024 * 1024
# What the local store's volume holds beyond GATEWAY_JOB_STORE_MAX_BYTES: job records, leases
# and the files being written when the bound is reached (base/gateway.yaml says so too).
STORE_HEADROOM = 256 * MIB
# The module the gateway imports for `--batch-executor kubernetes` (gateway/app.py).
EXECUTOR_MODULES = {"local": [], "kubernetes": ["gateway.jobs.executors.kube"]}
# The Secret the runner pods of gateway/jobs/executors/kube.py and k8s/jobs/batch read
# (optional there).
CREDENTIALS = "detection-batch-credentials"
RUNNER_ACCOUNT = "detection-batch"


def gateway_env(objs: list[Obj]) -> dict[str, str]:
    return env_of(container(find(objs, "Deployment", GATEWAY), "gateway"), objs)


def scheme(uri: str) -> str:
    """fsspec's protocol for a store or prefix: "file" for a plain path."""
    protocol, _ = fsspec.core.split_protocol(uri)
    return protocol or "file"


def storage_uris(objs: list[Obj]) -> list[str]:
    """Every place the gateway reads or writes jobs' data: the store and the allowed prefixes."""
    settings = gateway_settings(objs)
    env = gateway_env(objs)
    prefixes = [settings.batch_allowed_uris, env.get("GATEWAY_BATCH_ALLOWED_INPUT_URIS", "")]
    return [settings.job_store, *(p.strip() for t in prefixes for p in t.split(",") if p.strip())]


def store_max_bytes(objs: list[Obj]) -> int:
    env = gateway_env(objs)
    assert "GATEWAY_JOB_STORE_MAX_BYTES" in env, "the job store has no bound"
    settings = gateway_settings(objs)
    if hasattr(settings, "job_store_max_bytes"):
        return int(settings.job_store_max_bytes)
    return int(env["GATEWAY_JOB_STORE_MAX_BYTES"])


def third_party_imports(module: str) -> set[str]:
    """Top-level modules outside the standard library and the gateway that `module` imports
    when it is loaded, directly or through the gateway modules it imports (read from their
    source; imports inside functions are optional features, such as tracing)."""
    found: set[str] = set()
    pending, seen = [module], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # `from gateway.x import name` where name is no module
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        seen.add(name)
        tree = ast.parse(Path(spec.origin).read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for imported in names:
                top = imported.partition(".")[0]
                if top == "gateway":
                    pending.append(imported)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    found.add(top)
    return found


def needed_distributions(executor: str, schemes: set[str]) -> set[str]:
    """What the image must hold for this executor and these stores: the distributions of the
    executor module's imports and of fsspec's implementation for each scheme, and everything
    they require."""
    modules = {m for name in EXECUTOR_MODULES[executor] for m in third_party_imports(name)}
    for protocol in schemes - {"file"}:
        implementation = known_implementations[protocol]["class"]
        modules.add(implementation.partition(".")[0])
    owners = metadata.packages_distributions()
    for module in modules:
        assert module in owners, f"no installed distribution ships the module {module}"
    return closure(sorted({d for m in modules for d in owners[m]}))


# ---- the image --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_the_image_has_what_the_executor_and_store_of_each_render_need(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    schemes = {scheme(uri) for uri in storage_uris(objs)}
    needed = needed_distributions(settings.batch_executor, schemes)
    if settings.batch_executor == "kubernetes":
        assert "kubernetes" in needed
    missing = needed - set(image_distributions())
    assert not missing, f"{target}: the image lacks {sorted(missing)} (requirements-*.txt)"


def test_the_image_has_every_object_store_the_docs_offer() -> None:
    # components/jobs/README.md and the batch runner's README: s3:// and gs://.
    needed = needed_distributions("kubernetes", {"s3", "gs"})
    assert {"kubernetes", "s3fs", "gcsfs"} <= needed
    assert needed <= set(image_distributions())


# ---- components/jobs --------------------------------------------------------------------------


def kubernetes_overlays() -> list[str]:
    return [t for t in OVERLAYS if gateway_settings(rendered(t)).batch_executor == "kubernetes"]


def test_prod_runs_jobs_in_the_cluster_and_dev_in_the_gateway() -> None:
    assert kubernetes_overlays() == ["prod"]
    for target in ("dev", "dev-tls"):
        assert gateway_settings(rendered(target)).batch_executor == "local"


@pytest.mark.parametrize("target", ["prod"])
def test_the_kubernetes_executor_shares_a_store_on_object_storage(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    # Every replica and every runner pod reaches it; a path would be one pod's disk.
    assert scheme(settings.job_store) in {"s3", "gs"}, settings.job_store
    pod = pod_spec(find(objs, "Deployment", GATEWAY))
    c = container(find(objs, "Deployment", GATEWAY), "gateway")
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "models"}
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp", "/etc/detection-gateway/models"}
    # Credentials by reference only, from the Secret the runner pods read too.
    assert c["envFrom"] == [{"secretRef": {"name": CREDENTIALS}}]
    assert not [e for e in c["env"] if "AWS_" in e["name"] or "GOOGLE_" in e["name"]]
    # The store is bounded even though a bucket has no size of its own.
    assert store_max_bytes(objs) > 0


@pytest.mark.parametrize("target", ["prod"])
def test_runner_pods_run_the_gateways_image_against_its_service(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    c = container(find(objs, "Deployment", GATEWAY), "gateway")
    # Empty: the gateway reads its own pod's image (gateway/jobs/executors/kube.py), so an overlay's
    # `images` reach the runner pods with nothing to copy; the pod is named by the downward
    # API, and the Role lets the gateway read pods.
    assert settings.batch_image == ""
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in c["env"]
        if "fieldRef" in e.get("valueFrom", {})
    }
    assert fields["POD_NAME"] == "metadata.name"
    assert fields["POD_NAMESPACE"] == "metadata.namespace"
    role = find(objs, "Role", "detection-batch-executor")
    assert any("pods" in r["resources"] and "get" in r["verbs"] for r in role["rules"])
    assert c["image"] != GATEWAY and ":" in c["image"]  # the overlay's release, not a bare name
    service = find(objs, "Service", GATEWAY)
    grpc = {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"]
    assert settings.batch_runner_target == f"{GATEWAY}:{grpc}"
    # Jobs go to the gateway's own namespace, where the Role allows them.
    assert settings.batch_namespace == ""


@pytest.mark.parametrize("target", ["prod"])
def test_runner_account_exists_and_equals_the_one_of_the_batch_job(target: str) -> None:
    objs = rendered(target)
    account = find(objs, "ServiceAccount", RUNNER_ACCOUNT)
    # k8s/jobs/batch, applied beside it into the same namespace.
    (by_hand,) = [o for o in render_kustomization("jobs/batch") if o["kind"] == "ServiceAccount"]
    account["metadata"].pop("namespace")
    assert account == by_hand
    assert account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("target", ["prod"])
def test_only_the_runner_pods_may_name_a_jobs_owner(target: str) -> None:
    """Jobs pay their owner's share (issue 42): the executor gives runner pods `--owner` only
    when the gateway knows their identity, and takes the owner only from them. Under the mesh
    that is their ServiceAccount's SPIFFE URI, in the namespace they run in."""
    objs = rendered(target)
    account = find(objs, "ServiceAccount", RUNNER_ACCOUNT)
    namespace = account["metadata"]["namespace"]
    assert gateway_env(objs)["GATEWAY_BATCH_RUNNER_IDENTITIES"] == (
        f"uri:spiffe://cluster.local/ns/{namespace}/sa/{RUNNER_ACCOUNT}"
    )
    assert gateway_settings(objs).batch_runner_identities.startswith("uri:spiffe://")


def test_the_components_readme_names_what_the_user_provides() -> None:
    readme = (ROOT / "k8s" / "components" / "jobs" / "README.md").read_text()
    for needed in (CREDENTIALS, "GATEWAY_JOB_STORE", "AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL"):
        assert needed in readme, needed


# ---- the local store --------------------------------------------------------------------------


def store_volume(objs: list[Obj], path: str) -> Obj:
    """The volume mounted at or above `path` in the gateway's container (deepest mount)."""
    deployment = find(objs, "Deployment", GATEWAY)
    mounts = [
        m
        for m in container(deployment, "gateway")["volumeMounts"]
        if PurePosixPath(path).is_relative_to(m["mountPath"])
    ]
    assert mounts, f"the job store {path} is on the read-only root filesystem"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    assert not mount.get("readOnly"), mount
    (volume,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"]]
    return dict(volume)


@pytest.mark.parametrize("target", ["base", "dev", "dev-tls"])
def test_the_local_store_volume_is_sized_from_its_bound(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    volume = store_volume(objs, settings.job_store)
    # A volume of its own: /tmp (64 MiB) would be filled by one upload and the pod evicted.
    assert volume["name"] != "tmp"
    assert "emptyDir" in volume, volume
    size = parse_quantity(volume["emptyDir"]["sizeLimit"])
    # The kubelet evicts the pod past sizeLimit; the gateway refuses new data past its bound
    # first, with room left for what the bound does not count.
    assert size == store_max_bytes(objs) + STORE_HEADROOM, (size, store_max_bytes(objs))


def test_a_store_on_the_pods_disk_means_one_replica() -> None:
    local = []
    for target in OVERLAYS:
        objs = rendered(target)
        if scheme(gateway_settings(objs).job_store) != "file":
            continue
        local.append(target)
        deployment = find(objs, "Deployment", GATEWAY)
        # Other replicas could not see its operations, and they would be lost with the pod.
        assert deployment["spec"].get("replicas") == 1, target
        scaled = [
            h
            for h in of_kind(objs, "HorizontalPodAutoscaler")
            if h["spec"]["scaleTargetRef"]["name"] == GATEWAY
        ]
        assert not scaled, target
    assert local == ["dev", "dev-tls"]


# ---- the caller's identity ------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_xfcc_is_trusted_exactly_where_a_sidecar_overwrites_it(target: str) -> None:
    objs = rendered(target)
    deployment = find(objs, "Deployment", GATEWAY)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    sidecar = labels.get("sidecar.istio.io/inject") == "true"
    trusted = gateway_env(objs).get("GATEWAY_TRUST_XFCC", "false")
    # Without a sidecar any client could write the header and be whoever it names.
    assert trusted == ("true" if sidecar else "false"), target
    settings = gateway_settings(objs)
    if hasattr(settings, "trust_xfcc"):
        assert settings.trust_xfcc is sidecar

"""A real Kubernetes API server for tests: etcd + kube-apiserver from KUBEBUILDER_ASSETS.

The envtest convention (controller-runtime's name for the directory holding the binaries):
both processes run on random loopback ports in a temporary directory, with a token for an
admin (system:masters, who may also impersonate ServiceAccounts) and RBAC authorization. No
kubelet, scheduler or controller-manager: objects are validated, defaulted, admitted and
stored, but no Pod ever runs.

    with run_apiserver(Path(os.environ["KUBEBUILDER_ASSETS"]), tmp_path) as server:
        server.kubectl("get", "namespaces")
"""

from __future__ import annotations

import secrets
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.localserver import free_port

KUBECTL = Path(sys.executable).parent / "kubectl"
HOST = "127.0.0.1"
# The API server is ready in about 3 s on 2 cores; slow CI machines get more.
START_TIMEOUT = 90.0
# etcd exits at once on SIGTERM; the API server may drain its watches for a minute, which
# tests do not need: SIGKILL after this long (controller-runtime's envtest does the same).
STOP_GRACE = 5.0
_LOG_TAIL = 4000


class ApiServerError(RuntimeError):
    """The API server or etcd did not start; the message quotes their logs."""


@dataclass
class ApiServer:
    directory: Path
    url: str
    token: str
    kubeconfig: Path

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this server as the admin; `check` fails on a non-zero exit."""
        result = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result


def _write_service_account_keys(pki: Path) -> None:
    """The key pair the API server signs and checks ServiceAccount tokens with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki / "sa.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    (pki / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _kubeconfig(url: str, token: str) -> str:
    # The serving certificate is self-signed by the API server at start (--cert-dir), so the
    # client skips verification: everything stays on loopback.
    return f"""\
apiVersion: v1
kind: Config
clusters:
  - name: envtest
    cluster: {{server: "{url}", insecure-skip-tls-verify: true}}
users:
  - name: admin
    user: {{token: "{token}"}}
contexts:
  - name: envtest
    context: {{cluster: envtest, user: admin, namespace: default}}
current-context: envtest
"""


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-_LOG_TAIL:] if path.exists() else "(no log)"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str, token: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.read() == b"ok")
    except (urllib.error.URLError, OSError):
        return False


def _start(command: Sequence[str], log: Path, stack: ExitStack) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(_stop, process)
    return process


@contextmanager
def run_apiserver(assets: Path, directory: Path) -> Iterator[ApiServer]:
    """etcd and kube-apiserver from `assets`, state and logs in `directory`; stopped on exit."""
    for binary in ("etcd", "kube-apiserver"):
        if not (assets / binary).is_file():
            raise ApiServerError(f"{assets / binary} does not exist (KUBEBUILDER_ASSETS={assets})")
    pki = directory / "pki"
    pki.mkdir(parents=True)
    _write_service_account_keys(pki)
    token = secrets.token_hex(16)
    (pki / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    etcd_port, api_port = free_port(), free_port()
    url = f"https://{HOST}:{api_port}"

    with ExitStack() as stack:
        etcd = _start(
            [
                str(assets / "etcd"),
                f"--data-dir={directory / 'etcd'}",
                f"--listen-client-urls=http://{HOST}:{etcd_port}",
                f"--advertise-client-urls=http://{HOST}:{etcd_port}",
                f"--listen-peer-urls=http://{HOST}:0",
            ],
            directory / "etcd.log",
            stack,
        )
        apiserver = _start(
            [
                str(assets / "kube-apiserver"),
                f"--etcd-servers=http://{HOST}:{etcd_port}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                f"--secure-port={api_port}",
                f"--cert-dir={pki}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--enable-priority-and-fairness=false",
                # As on real clusters (kubeadm, managed ones): privileged containers are
                # allowed by the API server, so what refuses them is admission (Pod Security,
                # the runner policy of k8s/components/jobs), which the tests check.
                "--allow-privileged=true",
            ],
            directory / "kube-apiserver.log",
            stack,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not _ready(url, token):
            for name, process in (("etcd", etcd), ("kube-apiserver", apiserver)):
                if process.poll() is not None:
                    raise ApiServerError(
                        f"{name} exited with {process.returncode}:\n"
                        f"{_tail(directory / f'{name}.log')}"
                    )
            if time.monotonic() > deadline:
                raise ApiServerError(
                    f"kube-apiserver not ready after {START_TIMEOUT:.0f} s:\n"
                    f"{_tail(directory / 'kube-apiserver.log')}"
                )
            time.sleep(0.2)
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(_kubeconfig(url, token))
        yield ApiServer(directory, url, token, kubeconfig)

"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager with the CONTROLLERS workloads need) on loopback.

The binaries come from `tests/e2e/controlplane/build.sh` (built from Go modules). Every
process listens on a free 127.0.0.1 port; all state lives in one work directory.
Users authenticate with client certificates from a throw-away CA: CN is the user
name and each O is a group, exactly as the API server reads them.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client

from .pki import CertificateAuthority, KeyPair, write_signing_key
from .proxy import ServiceProxy

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "tests" / "e2e" / "controlplane" / "build.sh"
ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "ServiceAccount",
    "NodeRestriction",
    "Priority",
    "DefaultTolerationSeconds",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",  # on by default; named because fairgate relies on it
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
)
# The Kubernetes Workload API (KEP-4671) as 1.36 serves it: PodGroups and Workloads in
# scheduling.k8s.io/v1alpha2 behind the GenericWorkload gate, a pod joining one through
# spec.schedulingGroup.podGroupName; GangScheduling makes the kube-scheduler honour
# a PodGroup's gang policy. Every component gets the same gates.
FEATURE_GATES = "--feature-gates=GenericWorkload=true,GangScheduling=true"
RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1alpha2=true"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The kube-controller-manager controllers the e2e cluster runs: what Deployments,
# StatefulSets and Jobs need, plus namespace deletion, `default` ServiceAccounts, garbage
# collection of owned objects, node lifecycle (the not-ready taint) and the ResourceClaims
# of pods that name a ResourceClaimTemplate (DRA).
NODE_LIFECYCLE = "node-lifecycle-controller"
CONTROLLERS = (
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "resourceclaim-controller",
    NODE_LIFECYCLE,
)


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message says which part and why."""


def run_build(script: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Run a build script of tests/e2e/controlplane/ (each caches what it builds and is
    a no-op when up to date) and return the cache directory they share; `progress` gets
    each line the script prints as it prints it."""
    cache = Path(
        os.environ.get("FAIRGATE_CP_CACHE", Path.home() / ".cache" / "fairgate-controlplane")
    )
    lines: list[str] = []
    with subprocess.Popen(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    ) as build:
        assert build.stdout is not None
        for line in build.stdout:
            lines.append(line.rstrip("\n"))
            if progress is not None:
                progress(lines[-1])
    if build.returncode != 0:
        output = "\n".join(lines)[-8000:]
        raise ControlPlaneError(
            f"{script} failed (exit {build.returncode}); it needs Go 1.26+ and the Go "
            f"module proxy.\n{output}"
        )
    return cache


def build_controlplane(progress: Callable[[str], None] | None = None) -> Path:
    """Build (or reuse the cached) control plane binaries and return their directory.

    `progress` gets each line build.sh prints as it prints it (what it builds, how long
    a cold build takes, each binary done), so a caller can show a long build's progress.
    """
    return run_build(BUILD_SCRIPT, progress) / "bin"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """A child process whose stdout and stderr go to `<log_dir>/<name>.log`."""

    def __init__(
        self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log: IO[bytes] = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def check_alive(self) -> None:
        """Raise ControlPlaneError with the log tail if the process has exited."""
        if not self.alive():
            raise ControlPlaneError(
                f"{self.name} exited with code {self.popen.returncode}; last log lines "
                f"({self.log_path}):\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


def wait_until_ok(
    url: str, context: ssl.SSLContext | None, processes: Sequence[Process], timeout: float
) -> None:
    """Poll `url` until it answers 200, failing fast if one of `processes` dies."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        for process in processes:
            process.check_alive()
        try:
            with urllib.request.urlopen(url, context=context, timeout=5) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            last = f"HTTP {error.code}: {error.read()[:2000].decode(errors='replace')}"
        except OSError as error:
            last = str(error)
        time.sleep(0.3)
    raise ControlPlaneError(f"{url} not ready after {timeout:.0f}s: {last}")


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager, started by
    `start()` and stopped by `stop()`."""

    def __init__(
        self, bin_dir: Path, work_dir: Path, controllers: Sequence[str] = CONTROLLERS
    ) -> None:
        """`controllers`: the kube-controller-manager controllers to run (a test that
        plays one of them itself, e.g. the node lifecycle, leaves it out)."""
        self.bin_dir = bin_dir
        self.controllers = tuple(controllers)
        self.work_dir = work_dir
        self.pki_dir = work_dir / "pki"
        self.log_dir = work_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority(self.pki_dir)
        self.apiserver_port = free_port()
        self.url = f"https://127.0.0.1:{self.apiserver_port}"
        self.processes: list[Process] = []
        self.services = ServiceProxy()
        self._clients: dict[tuple[str, tuple[str, ...]], client.ApiClient] = {}
        self._kubeconfigs: dict[tuple[str, tuple[str, ...]], Path] = {}
        self.admin_kubeconfig = self.kubeconfig_for("e2e-admin", ["system:masters"])

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Start every process and return once each is ready (healthy)."""
        self.services.start()
        try:
            etcd_url = self._start_etcd(timeout)
            self._start_apiserver(etcd_url, timeout)
            self._start_scheduler(timeout)
            self._start_controller_manager(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process (newest first) and close every client."""
        for api in self._clients.values():
            api.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        while self.processes:
            self.processes.pop().stop()
        self.services.stop()

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, argv, self.log_dir, env)
        self.processes.append(process)
        return process

    def _start_etcd(self, timeout: float) -> str:
        client_url = f"http://127.0.0.1:{free_port()}"
        peer_url = f"http://127.0.0.1:{free_port()}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=e2e",
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_until_ok(f"{client_url}/health", None, [etcd], timeout)
        return client_url

    def _start_apiserver(self, etcd_url: str, timeout: float) -> None:
        serving = self.ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            ip_addresses=["127.0.0.1", "10.96.0.1"],
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        signing = write_signing_key(self.pki_dir, "service-account")
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca.cert_file}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={signing.cert}",
                f"--service-account-signing-key-file={signing.key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=false",
                "--profiling=false",
                FEATURE_GATES,
                RUNTIME_CONFIG,
                "--v=1",
            ],
            # Webhook Services are reached through the proxy (see harness.proxy); Go
            # never proxies loopback addresses, so etcd and the API server itself are not.
            env={**os.environ, "HTTPS_PROXY": self.services.url, "NO_PROXY": ""},
        )
        wait_until_ok(f"{self.url}/readyz", self._tls_context(), [apiserver], timeout)

    def _start_component(
        self, name: str, args: Sequence[str], ready_path: str, timeout: float
    ) -> None:
        """Start `name` (kube-scheduler, kube-controller-manager) as the user
        `system:<name>` that RBAC's bootstrap roles know, serving TLS on a free port,
        and wait until `ready_path` answers 200."""
        port = free_port()
        serving = self.ca.issue(
            f"{name}-serving", name, server=True, ip_addresses=["127.0.0.1"]
        )
        kubeconfig = self.kubeconfig_for(f"system:{name}")
        process = self._spawn(
            name,
            [
                str(self.bin_dir / name),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                FEATURE_GATES,
                *args,
                "--v=1",
            ],
        )
        wait_until_ok(
            f"https://127.0.0.1:{port}{ready_path}",
            self._tls_context(),
            [process, *self.processes],
            timeout,
        )

    def _start_scheduler(self, timeout: float) -> None:
        self._start_component("kube-scheduler", [], "/readyz", timeout)

    def _start_controller_manager(self, timeout: float) -> None:
        """The controllers asked for (default CONTROLLERS), each with its own ServiceAccount
        credentials as in a kubeadm cluster, so pods they create are admitted as
        `system:serviceaccount:kube-system:<controller>`."""
        self._start_component(
            "kube-controller-manager",
            [
                f"--controllers={','.join(self.controllers)}",
                "--use-service-account-credentials=true",
            ],
            "/healthz",
            timeout,
        )

    def _tls_context(self) -> ssl.SSLContext:
        admin = self._credentials("e2e-admin", ["system:masters"])
        context = ssl.create_default_context(cafile=str(self.ca.cert_file))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        return context

    # -- users -------------------------------------------------------------------------

    def _credentials(self, user: str, groups: Sequence[str] = ()) -> KeyPair:
        stem = "user-" + "".join(c if c.isalnum() else "_" for c in user)
        if groups:
            stem += "-" + "-".join("".join(c if c.isalnum() else "_" for c in g) for g in groups)
        cert, key = self.pki_dir / f"{stem}.crt", self.pki_dir / f"{stem}.key"
        if cert.exists():
            return KeyPair(cert=cert, key=key)
        return self.ca.issue(stem, user, organizations=groups)

    def kubeconfig_for(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig file that authenticates as `user` in `groups` by client certificate."""
        key = (user, tuple(groups))
        if key not in self._kubeconfigs:
            pair = self._credentials(user, groups)
            path = self.work_dir / "kubeconfig" / f"{pair.cert.stem}.yaml"
            self._write_kubeconfig(
                path, {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
            )
            self._kubeconfigs[key] = path
        return self._kubeconfigs[key]

    def token_kubeconfig(
        self, namespace: str, service_account: str, expiration_seconds: int = 86400
    ) -> Path:
        """A kubeconfig holding a bound token (TokenRequest) for an existing ServiceAccount."""
        core: Any = client.CoreV1Api(self.admin)
        response = core.create_namespaced_service_account_token(
            service_account, namespace, {"spec": {"expirationSeconds": expiration_seconds}}
        )
        path = self.work_dir / "kubeconfig" / f"sa-{namespace}-{service_account}.yaml"
        self._write_kubeconfig(path, {"token": response.status.token})
        return path

    def _write_kubeconfig(self, path: Path, user: dict[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.ca.cert_file),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "user"}}],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def client_for(self, user: str, groups: Sequence[str] = ()) -> client.ApiClient:
        """A `kubernetes` ApiClient authenticated as `user` in `groups` (cached per pair)."""
        key = (user, tuple(groups))
        if key not in self._clients:
            pair = self._credentials(user, groups)
            configuration = client.Configuration(
                host=self.url,
                ssl_ca_cert=str(self.ca.cert_file),
                cert_file=str(pair.cert),
                key_file=str(pair.key),
            )
            self._clients[key] = client.ApiClient(configuration)
        return self._clients[key]

    @property
    def admin(self) -> client.ApiClient:
        """A cluster-admin client (group system:masters)."""
        return self.client_for("e2e-admin", ["system:masters"])

    def check_alive(self) -> None:
        """Raise ControlPlaneError if any control-plane process has died."""
        for process in self.processes:
            process.check_alive()

"""fairgate's image, built without Docker (image/build.sh: buildah on a debootstrap'd
Debian, wheels from PyPI) and run with podman as the cluster runs it: non-root, read-only
root filesystem, no capabilities. `fairgate --version` prints the chart's appVersion and
`fairgate serve` answers /healthz over TLS.

The build is cached (the Debian rootfs and the base layer are made once); .ci/run builds
it before the tests. Needs root, buildah, podman and debootstrap (Debian packages).
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from certs import write_bundle

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHART = yaml.safe_load((REPO / "charts" / "fairgate" / "Chart.yaml").read_text())
APP_VERSION = CHART["appVersion"]
IMAGE = f"localhost/fairgate:{APP_VERSION}"
# As the Deployments run it: the image's user, nothing writable but /tmp, no capabilities.
RESTRICTED = ["--read-only", "--tmpfs", "/tmp", "--user", "65532:65532", "--cap-drop", "ALL",
              "--security-opt", "no-new-privileges"]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: apt-get install buildah podman runc debootstrap")
    return found


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    """The built image's buildah inspect (built first when missing or stale)."""
    build = subprocess.run(["bash", str(REPO / "image" / "build.sh")], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stdout + build.stderr
    inspected = subprocess.run([_tool("buildah"), "inspect", "--type", "image", IMAGE],
                               capture_output=True, text=True, check=True, timeout=60)
    info: dict[str, Any] = json.loads(inspected.stdout)
    return info


# How podman runs here (a container itself, cgroup v1 with an empty v2 hierarchy beside it,
# no CAP_SYS_RESOURCE): crun refuses the "hybrid" cgroup layout, so runc with plain
# cgroupfs; podman's default rlimits are above this machine's and cannot be raised
# without CAP_SYS_RESOURCE, so lower ones. On an ordinary host these change nothing the
# tests look at.
PODMAN_GLOBAL = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    _tool("runc")
    if args and args[0] == "run":
        args = ("run", *LIMITS, *args[1:])
    return subprocess.run([_tool("podman"), *PODMAN_GLOBAL, *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_image_config_is_the_dockerfiles(image: dict[str, Any]) -> None:
    config = image["OCIv1"]["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["fairgate"]
    assert config["Cmd"] == ["--help"]
    assert config["WorkingDir"] == "/tmp"
    assert "8443/tcp" in config["ExposedPorts"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == APP_VERSION
    assert labels["org.opencontainers.image.title"] == "fairgate"
    # the Debian base, then fairgate: two layers
    assert len(image["OCIv1"]["rootfs"]["diff_ids"]) == 2


def test_no_pip_and_no_compiler_in_the_image(image: dict[str, Any]) -> None:
    found = _podman("run", "--rm", *RESTRICTED, "--network", "none", "--entrypoint", "sh",
                    IMAGE, "-c", "for c in pip pip3 gcc cc fairgate; do command -v $c; done; true")
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["/opt/fairgate/bin/fairgate"]


def test_version_is_the_charts_app_version(image: dict[str, Any]) -> None:
    run = _podman("run", "--rm", *RESTRICTED, "--network", "none", IMAGE, "--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"fairgate {APP_VERSION}"


def test_serve_answers_healthz_over_tls(
    image: dict[str, Any], tmp_path: Path, redis_url: str
) -> None:
    """`fairgate serve` from the image, as non-root on a read-only root: TLS 1.2+ with a
    certificate of `fairgate certs generate`, checked against its CA."""
    certs = tmp_path / "certs"
    paths = write_bundle(certs, "fairgate-webhook", "fairgate-system", ("127.0.0.1",))
    for path in certs.iterdir():
        path.chmod(0o644)  # readable by uid 65532 through the bind mount
    certs.chmod(0o755)
    config = tmp_path / "config"
    shutil.copytree(REPO / "examples" / "config", config)
    config.chmod(0o755)
    port = _free_port()
    name = f"fairgate-serve-{port}"
    started = _podman(
        "run", "--detach", "--rm", "--name", name, *RESTRICTED, "--network", "host",
        "-v", f"{certs}:/certs:ro", "-v", f"{config}:/config:ro", IMAGE,
        "serve", "--cert-dir", "/certs", "--host", "127.0.0.1", "--port", str(port),
        "--config-dir", "/config", "--redis-url", redis_url)
    assert started.returncode == 0, started.stderr
    try:
        trust = ssl.create_default_context(cafile=str(paths.ca_cert))
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trust, timeout=5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    logs = _podman("logs", name)
                    pytest.fail(f"no /healthz after 60 s:\n{logs.stdout}\n{logs.stderr}")
                time.sleep(0.5)
        assert answer.status_code == 200
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                trust.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        _podman("rm", "--force", name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

"""The `helm` CLI for the chart's tests, built from Go modules like the control plane.

`build_helm()` runs tests/e2e/controlplane/build-helm.sh (cached: a second run takes a
second) and returns the binary. `helm_run` runs it with a private Helm home (no repos,
no plugins, no cache of the user's), so that a run depends on nothing but the chart.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from .controlplane import REPO, ControlPlaneError

BUILD_SCRIPT = REPO / "tests" / "e2e" / "controlplane" / "build-helm.sh"
CHART = REPO / "charts" / "fairgate"


def build_helm(progress: Callable[[str], None] | None = None) -> Path:
    """Build (or reuse the cached) helm and return its path; `progress` gets each line
    the build script prints."""
    cache = Path(
        os.environ.get("FAIRGATE_CP_CACHE", Path.home() / ".cache" / "fairgate-controlplane")
    )
    lines: list[str] = []
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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
            f"{BUILD_SCRIPT} failed (exit {build.returncode}); it needs Go 1.26+ and the Go "
            f"module proxy.\n{output}"
        )
    return cache / "helm" / "helm"


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    """The environment of a helm run: its config, cache and data under `home`."""
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def helm_run(
    helm: Path, args: Sequence[str], home: Path, kubeconfig: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`helm args...`, its output captured (the caller checks the exit code)."""
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=timeout,
        env=helm_env(home, kubeconfig), check=False,
    )

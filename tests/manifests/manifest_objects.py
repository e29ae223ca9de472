"""Helpers for the manifest tests: paths, the kustomize build, object lookup.

Every test reads the objects that `kustomize build` prints for `manifests/`
(and `manifests/tenant-admin/`), never the source files directly. The build is
done by `kubetool` (tests/manifests/kubetool, Go): the kustomize library that
kubectl embeds plus the API server's CEL code, so that the tests need no
kubectl binary. `go` (1.26 or newer, as for the e2e tests) must be installed.
(A module of its own, not conftest, so that imports never pick up another
directory's conftest.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
TENANT_ADMIN = MANIFESTS / "tenant-admin"
KUBETOOL_SRC = Path(__file__).resolve().parent / "kubetool"
# The first build compiles k8s.io/apiserver and kustomize: minutes on 2 cores;
# later ones take about a second.
BUILD_TIMEOUT = 1500

Obj = dict[str, Any]


def go_binary() -> str:
    """The `go` command; a clear error when it is missing."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    if found is None:
        raise pytest.UsageError(
            "the manifest tests need Go 1.26 or newer on PATH to build "
            "tests/manifests/kubetool (kustomize and the API server's CEL)"
        )
    return found


def build_kubetool() -> Path:
    """Build kubetool into the user cache (Go skips the work when it is up to date)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    out = cache / "fairgate" / "kubetool"
    proc = subprocess.run(
        [go_binary(), "build", "-o", str(out), "."],
        cwd=KUBETOOL_SRC,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    if proc.returncode != 0:
        raise pytest.UsageError(f"building tests/manifests/kubetool failed:\n{proc.stderr[-4000:]}")
    return out


def kustomize_build(kubetool: Path, directory: Path) -> list[Obj]:
    """The objects `kustomize build directory` prints, in order."""
    proc = subprocess.run(
        [str(kubetool), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        pytest.fail(f"kustomize build {directory} failed: {proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` called ``name``."""
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected exactly one {kind} {name}, found {len(hits)}"
    return hits[0]


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    """All objects of ``kind``."""
    return [o for o in objs if o["kind"] == kind]


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Whether a metav1.LabelSelector selects an object with ``labels``."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True

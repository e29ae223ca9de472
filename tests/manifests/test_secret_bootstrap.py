"""Every component bootstraps itself: each Secret a pod of the base (or of the HA overlay)
needs is made by a fairgate command that one of the base's own containers runs, with
the RBAC to do it, and without waiting for that Secret itself. A fresh
`kubectl apply -k` so reaches every Deployment Ready with no Secret made by hand.

Kubernetes waits for a Secret a pod mounts as a volume before it starts any of the
pod's containers, and for a Secret an environment variable reads before it starts that
container; the maker of a Secret must therefore be an init container (or a native
sidecar) of a pod that does not mount it, and run before every container of its pod
that reads it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from manifest_objects import REPO, Obj, kustomize_build
from test_rbac import can

from certs.redis_secret import DEFAULT_REDIS_SECRET

NS = "fairgate-system"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")


def _arg(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def made_by(container: Obj) -> str | None:
    """The Secret this container's fairgate command creates, if it creates one."""
    command = container.get("command") or []
    if command[:2] == ["fairgate", "redis-secret"]:
        return _arg(command, "--name") or DEFAULT_REDIS_SECRET
    if command[:3] == ["fairgate", "certs", "ensure"]:
        return _arg(command, "--secret")
    return None


def _needed_by_env(container: Obj) -> set[str]:
    names = {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
             if "secretKeyRef" in e.get("valueFrom", {})
             and not e["valueFrom"]["secretKeyRef"].get("optional")}
    names |= {e["secretRef"]["name"] for e in container.get("envFrom", [])
              if "secretRef" in e and not e["secretRef"].get("optional")}
    return names


def _mounted(pod: Obj) -> set[str]:
    return {v["secret"]["secretName"] for v in pod.get("volumes", [])
            if "secret" in v and not v["secret"].get("optional")}


def _pods(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"])
            for o in objs if o["kind"] in WORKLOAD_KINDS]


def check_bootstrap(objs: list[Obj]) -> list[str]:
    """What keeps a fresh install from coming up: one line per problem."""
    makers: dict[str, tuple[str, Obj, int]] = {}  # Secret -> workload, pod, init index
    problems = []
    for workload, pod in _pods(objs):
        for index, container in enumerate(pod.get("initContainers", [])):
            secret = made_by(container)
            if secret is not None:
                makers[secret] = (workload, pod, index)
        for container in pod["containers"]:
            if made_by(container) is not None:
                problems.append(f"{workload}/{container['name']} makes a Secret but is not an "
                                "init container: the pod's other containers may start first")
    for secret, (workload, pod, index) in makers.items():
        account = ("ServiceAccount", pod.get("serviceAccountName", "default"), NS)
        if not (can(objs, account, "create", "secrets", namespace=NS)
                and all(can(objs, account, verb, "secrets", name=secret, namespace=NS)
                        for verb in ("get", "patch"))):
            problems.append(f"{workload}'s ServiceAccount may not create and patch {secret}")
        if secret in _mounted(pod):
            problems.append(f"{workload} mounts {secret}, which it makes itself: it never starts")
        earlier = pod["initContainers"][:index]
        if any(secret in _needed_by_env(c) for c in earlier):
            problems.append(f"{workload} reads {secret} before its maker runs")
    for workload, pod in _pods(objs):
        needed = _mounted(pod).union(
            *(_needed_by_env(c) for c in [*pod.get("initContainers", []), *pod["containers"]]))
        for secret in sorted(needed - set(makers)):
            problems.append(f"{workload} waits for Secret {secret}, which nothing creates")
    return problems


def test_base_bootstraps_every_secret(base: list[Obj]) -> None:
    assert check_bootstrap(base) == []


def test_ha_overlay_bootstraps_every_secret(kubetool: Path) -> None:
    assert check_bootstrap(kustomize_build(kubetool, REPO / "overlays" / "ha")) == []


def test_the_console_tls_secret_is_made_by_the_console_itself(base: list[Obj]) -> None:
    (console,) = [pod for name, pod in _pods(base) if name == "fairgate-console"]
    assert [made_by(c) for c in console["initContainers"]] == ["fairgate-console-tls"]


@pytest.mark.parametrize("broken", ["mount", "no-maker", "no-rbac"])
def test_the_check_finds_what_keeps_a_pod_waiting(base: list[Obj], broken: str) -> None:
    """The check above can fail: the console as it was (its Secret mounted and made by
    nobody), and a maker without the RBAC."""
    objs = copy.deepcopy(base)
    console = next(o for o in objs if o["metadata"]["name"] == "fairgate-console"
                   and o["kind"] == "Deployment")["spec"]["template"]["spec"]
    if broken in ("mount", "no-maker"):
        for volume in console["volumes"]:
            if volume["name"] == "tls":
                volume.clear()
                volume.update({"name": "tls", "secret": {"secretName": "fairgate-console-tls"}})
    if broken == "no-maker":
        del console["initContainers"]
    if broken == "no-rbac":
        objs = [o for o in objs if o["metadata"]["name"] != "fairgate-console-tls"]
    secret = "fairgate-console-tls"
    expected = {
        "mount": f"fairgate-console mounts {secret}, which it makes itself: it never starts",
        "no-maker": f"fairgate-console waits for Secret {secret}, which nothing creates",
        "no-rbac": f"fairgate-console's ServiceAccount may not create and patch {secret}",
    }[broken]
    assert expected in check_bootstrap(objs)

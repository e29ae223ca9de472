"""The HA overlay ``overlays/ha/`` (kustomize forbids an overlay inside its base
directory, so it sits beside ``manifests/``, like the production overlay of
docs/install.md): built by kustomize on the base, valid
Kubernetes (strict schema), 3 Redis servers and 3 sentinels spread over nodes, PDBs,
the password only from the Secret, network policy that lets replication and the
sentinels through, and fairgate pointed at the sentinels with a URL fairgate parses."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from manifest_objects import REPO, Obj, find, kustomize_build, of_kind, selects
from test_manifest_schema import SCHEMA_VERSIONS, _validate
from test_workloads import REDIS_SECRET, _secret_env

from fairshare.connection import RedisTarget

HA = REPO / "overlays" / "ha"
SERVERS = ("StatefulSet", "fairgate-redis")
SENTINELS = ("StatefulSet", "fairgate-sentinel")
# Every pod of fairgate that talks to Redis: the console too (it writes fairness samples).
CLIENTS = [("Deployment", "fairgate-webhook"), ("Deployment", "fairgate-dispatcher"),
           ("Deployment", "fairgate-console")]


@pytest.fixture(scope="module")
def ha(kubetool: Path) -> list[Obj]:
    """The HA overlay, built."""
    return kustomize_build(kubetool, HA)


def _pod(objs: list[Obj], kind: str, name: str) -> Obj:
    template: Obj = find(objs, kind, name)["spec"]["template"]
    return template


def _container(objs: list[Obj], kind: str, name: str) -> Obj:
    (container,) = _pod(objs, kind, name)["spec"]["containers"]
    result: Obj = container
    return result


def _script(objs: list[Obj], kind: str, name: str) -> str:
    command = _container(objs, kind, name)["command"]
    assert command[:2] == ["sh", "-c"]
    script: str = command[2]
    return script


def test_every_file_of_the_overlay_is_used() -> None:
    kustomization = yaml.safe_load((HA / "kustomization.yaml").read_text())
    used = set(kustomization["resources"]) | {p["path"] for p in kustomization["patches"]}
    assert {p.name for p in HA.glob("*.yaml")} - {"kustomization.yaml"} <= used


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_ha_overlay_validates_strictly(ha: list[Obj], version: str) -> None:
    assert _validate(ha, version) == []


def test_the_base_is_all_there(ha: list[Obj], base: list[Obj]) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in ha}
    assert {(o["kind"], o["metadata"]["name"]) for o in base} <= names
    assert all(o["metadata"].get("namespace") in (None, "fairgate-system") for o in ha)


@pytest.mark.parametrize(("kind", "name"), [SERVERS, SENTINELS])
def test_three_of_each_on_three_nodes_with_a_pdb(ha: list[Obj], kind: str, name: str) -> None:
    workload = find(ha, kind, name)
    assert workload["spec"]["replicas"] == 3
    labels = workload["spec"]["template"]["metadata"]["labels"]
    (term,) = workload["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["labelSelector"], labels)
    pdbs = [p for p in of_kind(ha, "PodDisruptionBudget")
            if selects(p["spec"]["selector"], labels)]
    assert [p["spec"] for p in pdbs] == [{"maxUnavailable": 1,
                                          "selector": pdbs[0]["spec"]["selector"]}]


@pytest.mark.parametrize(("kind", "name"), [SERVERS, SENTINELS])
def test_restricted_and_password_only_from_the_secret(
    ha: list[Obj], kind: str, name: str
) -> None:
    spec = _pod(ha, kind, name)["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = _container(ha, kind, name)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"] == {
        "drop": ["ALL"]}
    assert set(container["resources"]) == {"requests", "limits"}
    ref = _secret_env(container, "REDISCLI_AUTH")
    assert (ref["name"], ref["key"]) == (REDIS_SECRET, "password")
    script = _script(ha, kind, name)
    # Every password in the script is the Secret's, through the environment.
    for line in script.splitlines():
        if re.search(r"requirepass|auth-pass|masterauth", line):
            assert '"$REDISCLI_AUTH"' in line, line
    subprocess.run(["sh", "-n", "-c", script], check=True)  # it parses


def test_fairgate_finds_the_primary_through_the_sentinels(ha: list[Obj]) -> None:
    sentinel = find(ha, *SENTINELS)
    service = find(ha, "Service", sentinel["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    (port,) = _container(ha, *SENTINELS)["ports"]
    monitor = re.search(r"sentinel monitor (\S+) \S+ (\d+) (\d+)", _script(ha, *SENTINELS))
    assert monitor is not None
    master, redis_port, quorum = monitor.groups()
    assert (int(redis_port), int(quorum)) == (6379, 2)  # 2 of 3 sentinels decide
    expected = {(f"{sentinel['metadata']['name']}-{i}.{service['metadata']['name']}",
                 port["containerPort"]) for i in range(3)}
    for kind, name in CLIENTS:
        container = _container(ha, kind, name)
        url = next(e["value"] for e in container["env"] if e["name"] == "REDIS_URL")
        target = RedisTarget.resolve(url, environ={})
        address = target.sentinel
        assert address is not None and target.replicated  # WAIT is on
        assert set(address.sentinels) == expected
        assert address.master == master
        ref = _secret_env(container, "REDIS_PASSWORD")
        assert (ref["name"], ref["key"]) == (REDIS_SECRET, "password")


def test_redis_refuses_writes_without_a_replica_and_replicates_with_the_password(
    ha: list[Obj],
) -> None:
    script = _script(ha, *SERVERS)
    assert "--min-replicas-to-write 1" in script
    assert '--masterauth "$REDISCLI_AUTH"' in script
    assert "--aclfile /etc/fairgate/redis-auth/users.acl" in script
    assert "--appendonly yes" in script
    service = find(ha, "Service", "fairgate-redis")
    assert service["spec"]["publishNotReadyAddresses"] is True


def _component(objs: list[Obj], kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = _pod(objs, kind, name)["metadata"]["labels"]
    return labels


@pytest.mark.parametrize(("policy", "port", "target"), [
    ("fairgate-redis", 6379, SERVERS), ("fairgate-sentinel", 26379, SENTINELS)])
def test_network_policy_lets_fairgate_replication_and_sentinels_through(
    ha: list[Obj], policy: str, port: int, target: tuple[str, str]
) -> None:
    spec = find(ha, "NetworkPolicy", policy)["spec"]
    assert selects(spec["podSelector"], _component(ha, *target))
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    (peer,) = rule["from"]
    for kind, name in [*CLIENTS, SERVERS, SENTINELS]:
        assert selects(peer["podSelector"], _component(ha, kind, name)), name
    stranger = {"app.kubernetes.io/name": "other", "app.kubernetes.io/component": "webhook"}
    assert not selects(peer["podSelector"], stranger)
    egress_ports = {p["port"] for rule in spec["egress"] for p in rule["ports"]}
    assert egress_ports == {6379, 26379, 53}

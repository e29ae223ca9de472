"""docs/install.md: the YAML it tells the platform team to use really works."""

from __future__ import annotations

import os
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from manifest_objects import MANIFESTS, REPO, TENANT_ADMIN, Obj, find, kustomize_build, of_kind

from tenants.schema import parse_platform, parse_quota

INSTALL = REPO / "docs" / "install.md"


def fenced_blocks(language: str) -> list[str]:
    """The bodies of the ```language fenced blocks of install.md (indentation removed)."""
    text = INSTALL.read_text()
    blocks = []
    for m in re.finditer(rf"^( *)```{language}\n(.*?)^\1```", text, re.M | re.S):
        indent = len(m.group(1))
        blocks.append("\n".join(line[indent:] for line in m.group(2).splitlines()))
    return blocks


def block_starting(language: str, first_line: str) -> str:
    (block,) = [b for b in fenced_blocks(language) if b.startswith(first_line)]
    return block


def test_production_overlay_builds(kubetool: Path, tmp_path: Path, base: list[Obj]) -> None:
    overlay = tmp_path / "overlays" / "prod"
    overlay.mkdir(parents=True)
    text = block_starting("yaml", "# overlays/prod/kustomization.yaml")
    # The doc's overlay sits two levels below the repository root.
    text = text.replace("../../manifests", os.path.relpath(MANIFESTS, overlay))
    (overlay / "kustomization.yaml").write_text(text)
    objs = kustomize_build(kubetool, overlay)
    names = {cm["metadata"]["name"] for cm in of_kind(objs, "ConfigMap")}
    assert names == {"fairgate-platform"}  # the example quotas are left out
    for name in ("fairgate-webhook", "fairgate-dispatcher"):
        (container,) = find(objs, "Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example.com/fairgate:0.1.0"
    redis = find(objs, "StatefulSet", "fairgate-redis")["spec"]["template"]["spec"]
    assert (
        redis["containers"][0]["image"]
        == find(base, "StatefulSet", "fairgate-redis")["spec"]["template"]["spec"]["containers"][0][
            "image"
        ]
    )
    assert len(objs) == len(base) - 2


def _quota_configmap() -> Obj:
    block = block_starting("sh", "kubectl apply -f - <<'EOF'")
    body = block.split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0]
    obj: Obj = yaml.safe_load(body)
    return obj


def test_onboarding_example_is_valid_config(base: list[Obj]) -> None:
    """The doc's team-c entry and quota pass fairgate's own schema, ceiling included."""
    entry = yaml.safe_load(block_starting("yaml", "tenants:\n  team-c:"))
    platform_doc = yaml.safe_load(
        find(base, "ConfigMap", "fairgate-platform")["data"]["platform.yaml"]
    )
    platform_doc["tenants"].update(entry["tenants"])
    platform = parse_platform(yaml.safe_dump(platform_doc))
    cm = _quota_configmap()
    assert cm["metadata"]["name"] == "quota-team-c"
    assert cm["metadata"]["namespace"] == "fairgate-system"
    assert cm["metadata"]["labels"] == {"fairgate.io/quota": "team-c"}
    parse_quota(cm["data"]["quota.yaml"], "team-c", platform)


@pytest.mark.parametrize("kind", ["mutatingwebhookconfiguration", "validatingwebhookconfiguration"])
def test_uninstall_deletes_webhook_configurations_first(kind: str) -> None:
    (block,) = [b for b in fenced_blocks("sh") if "kubectl delete -k manifests/" in b]
    first_delete = block.index("kubectl delete ")
    assert block.index(f"kubectl delete {kind} fairgate") < block.index("kubectl delete -k")
    # The validating configuration goes first: alone, it refuses every unstamped GPU pod.
    assert block[first_delete:].startswith("kubectl delete validatingwebhookconfiguration fairgate")


def test_helm_uninstall_deletes_webhook_configurations_first() -> None:
    (block,) = [b for b in fenced_blocks("sh") if "helm uninstall" in b]
    first_delete = block.index("kubectl delete ")
    assert block[first_delete:].startswith(
        "kubectl delete validatingwebhookconfiguration fairgate\n"
        "kubectl delete mutatingwebhookconfiguration fairgate\n")
    assert block.index("mutatingwebhookconfiguration") < block.index("helm uninstall")


def test_helm_values_example_renders(helm: Path, tmp_path: Path) -> None:
    """The doc's values file installs: `helm template` with it passes the chart's schema
    and fairgate's own config check."""
    from harness.helm import CHART, helm_run

    values = tmp_path / "my-values.yaml"
    values.write_text(block_starting("yaml", "# my-values.yaml"))
    proc = helm_run(helm, ["template", "fairgate", str(CHART), "-n", "fairgate-system",
                           "-f", str(values)], tmp_path / "home", timeout=120)
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    platform = parse_platform(find(objs, "ConfigMap", "fairgate-platform")["data"]["platform.yaml"])
    assert set(platform.tenants) == {"team-a", "team-b"}
    for tenant in platform.tenants:
        parse_quota(find(objs, "ConfigMap", f"quota-{tenant}")["data"]["quota.yaml"], tenant,
                    platform)
    (container,) = find(objs, "Deployment", "fairgate-webhook")["spec"]["template"]["spec"][
        "containers"]
    assert container["image"] == "registry.example.com/fairgate:0.1.0"


def test_the_helm_namespace_matches_the_base(base: list[Obj]) -> None:
    """The labels the doc puts on the namespace it creates are the base's Namespace's."""
    block = block_starting("sh", "kubectl create namespace fairgate-system")
    command = block.split("kubectl label namespace fairgate-system", 1)[1].split("\nhelm", 1)[0]
    labels = dict(word.split("=", 1) for word in command.replace("\\\n", " ").split())
    assert labels == find(base, "Namespace", "fairgate-system")["metadata"]["labels"]


def test_tenant_admin_template_instantiates(kubetool: Path, tmp_path: Path) -> None:
    """`cp -r manifests/tenant-admin ...` and `sed s/team-a/team-c/g`, as documented."""
    block = block_starting("sh", "cp -r manifests/tenant-admin")
    assert "sed -i 's/team-a/team-c/g'" in block
    copy = tmp_path / "tenant-admin-team-c"
    copy.mkdir()
    for source in TENANT_ADMIN.glob("*.yaml"):
        (copy / source.name).write_text(source.read_text().replace("team-a", "team-c"))
    objs = kustomize_build(kubetool, copy)
    for obj in objs:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    role = find(objs, "ClusterRole", "fairgate-quota-editor-team-c")
    assert [r["resourceNames"] for r in role["rules"]] == [["quota-team-c"]]
    binding = find(objs, "RoleBinding", "fairgate-quota-editor-team-c")
    assert binding["roleRef"]["name"] == "fairgate-quota-editor-team-c"
    assert "team-c-admins" in {s["name"] for s in binding["subjects"]}

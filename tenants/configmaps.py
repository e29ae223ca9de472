"""The admission verdict for fairgate's ConfigMaps (pure: no I/O).

Contract:
- Only ``fairgate-platform`` and ``quota-<tenant>`` in ``fairgate-system`` are fairgate's;
  every other ConfigMap is allowed untouched (``ours`` is False), except two that would
  only look like quotas and are refused for everyone: a CREATE in ``fairgate-system``
  without a name (``generateName``) whose prefix starts with ``quota-`` or that carries
  the label ``fairgate.io/quota`` (quota ConfigMaps must be created with their explicit
  name ``quota-<tenant>``), and a CREATE/UPDATE there of any other ConfigMap carrying that
  label (it is reserved for quota ConfigMaps).
- Who may do what is :mod:`tenants.authz`, judged against the *current* config.
- CREATE/UPDATE must carry exactly one data key (``platform.yaml`` / ``quota.yaml``)
  holding a valid document: schema errors name the field and the fix, YAML syntax errors
  the line. A quota must carry the label ``fairgate.io/quota: <tenant>`` matching its
  name, and its nominal, and nominal + borrowLimit, must fit the tenant's ceiling. A
  platform edit may not lower a ceiling below the nominal + borrowLimit of, or remove, a
  tenant whose quota exists (the message names the tenant).
- A quota below the tenant's current usage is allowed with a warning (nothing is
  evicted; new pods wait). Warnings are at most 120 characters.
- An allowed change carries ``audit_diff``: field path -> ``{"before", "after"}`` over
  the YAML documents (``None`` for an absent field).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tenants import authz, resources
from tenants.models import (
    CONTROL_NAMESPACE,
    PLATFORM_CONFIGMAP,
    PLATFORM_KEY,
    QUOTA_CONFIGMAP_PREFIX,
    QUOTA_KEY,
    QUOTA_LABEL,
    FairgateConfig,
    PlatformConfig,
)
from tenants.schema import (
    MAX_DOCUMENT_BYTES,
    MAX_QUOTA_BYTES,
    MAX_QUOTA_NODES,
    ConfigError,
    Problem,
    load_yaml_mapping,
    parse_platform,
    parse_quota,
)

MAX_WARNING = 120
WRITES = ("CREATE", "UPDATE")

FieldDiff = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class ConfigMapVerdict:
    """Allowed or not, why, warnings for the user, and the change for the audit record."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    audit_diff: FieldDiff | None = None
    tenant: str | None = None
    ours: bool = True


def quota_tenant(name: str) -> str | None:
    """The tenant of a quota ConfigMap name (``quota-team-a`` -> ``team-a``), else None."""
    tenant = name.removeprefix(QUOTA_CONFIGMAP_PREFIX)
    return tenant if name.startswith(QUOTA_CONFIGMAP_PREFIX) and tenant else None


def is_fairgate_configmap(name: str, namespace: str) -> bool:
    """Whether the ConfigMap ``namespace/name`` is one fairgate reads."""
    return namespace == CONTROL_NAMESPACE and (
        name == PLATFORM_CONFIGMAP or quota_tenant(name) is not None
    )


def review_configmap(
    operation: str,
    name: str,
    namespace: str,
    new_data: Mapping[str, str] | None,
    old_data: Mapping[str, str] | None,
    username: str,
    groups: Sequence[str],
    labels: Mapping[str, str] | None,
    current: FairgateConfig,
    usage_slices_by_tenant: Mapping[str, int] | None = None,
    generate_name: str = "",
) -> ConfigMapVerdict:
    """Decide a CREATE, UPDATE or DELETE of a ConfigMap (see the module doc).

    ``new_data``/``labels`` are the object's after the change (None on DELETE),
    ``old_data`` before it (None on CREATE); ``usage_slices_by_tenant`` is the current
    usage in slices, if known; ``generate_name`` is ``metadata.generateName`` (a CREATE
    without a name).
    """
    if not is_fairgate_configmap(name, namespace):
        return _lookalike_verdict(operation, name, namespace, generate_name, labels or {})
    if operation not in (*WRITES, "DELETE"):
        return ConfigMapVerdict(allowed=True)
    who = authz.describe(username, groups)
    if name == PLATFORM_CONFIGMAP:
        return _review_platform(operation, new_data, old_data, who, username, groups, current)
    tenant = quota_tenant(name)
    assert tenant is not None
    return _review_quota(operation, tenant, new_data, old_data, who, username, groups,
                         labels or {}, current, usage_slices_by_tenant)


def _lookalike_verdict(operation: str, name: str, namespace: str, generate_name: str,
                       labels: Mapping[str, str]) -> ConfigMapVerdict:
    """A ConfigMap that is not fairgate's by name: refused when it would pass for a quota
    (see the module doc), else not ours."""
    label = labels.get(QUOTA_LABEL)
    if namespace != CONTROL_NAMESPACE or operation not in WRITES:
        return ConfigMapVerdict(allowed=True, ours=False)
    example = f"{QUOTA_CONFIGMAP_PREFIX}{label or '<tenant>'}"
    if not name and (generate_name.startswith(QUOTA_CONFIGMAP_PREFIX) or label is not None):
        return _deny(
            f"quota ConfigMaps must be created with an explicit name: set metadata.name to "
            f"{example} instead of generateName {generate_name!r} (a generated name names "
            f"no tenant, and fairgate would not check it)", label)
    if label is not None:
        return _deny(
            f"the label {QUOTA_LABEL} is reserved for quota ConfigMaps named "
            f"{QUOTA_CONFIGMAP_PREFIX}<tenant> in {CONTROL_NAMESPACE}: remove it from "
            f"{name!r}, or name the ConfigMap {example}", label)
    return ConfigMapVerdict(allowed=True, ours=False)


def review_configmap_request(
    request: Mapping[str, Any],
    current: FairgateConfig,
    usage_slices_by_tenant: Mapping[str, int] | None = None,
) -> ConfigMapVerdict:
    """:func:`review_configmap` for the ``request`` of an AdmissionReview v1 on a ConfigMap."""
    new = request.get("object") or None
    old = request.get("oldObject") or None
    meta = (new or old or {}).get("metadata") or {}
    user = request.get("userInfo") or {}
    return review_configmap(
        operation=str(request.get("operation", "")),
        name=str(request.get("name") or meta.get("name") or ""),
        namespace=str(request.get("namespace") or meta.get("namespace") or ""),
        new_data=(new.get("data") or {}) if new is not None else None,
        old_data=(old.get("data") or {}) if old is not None else None,
        username=str(user.get("username", "")),
        groups=tuple(user.get("groups") or ()),
        labels=((new or {}).get("metadata") or {}).get("labels") or {},
        current=current,
        usage_slices_by_tenant=usage_slices_by_tenant,
        generate_name=str(meta.get("generateName") or ""),
    )


def _review_platform(operation: str, new_data: Mapping[str, str] | None,
                     old_data: Mapping[str, str] | None, who: str, user: str,
                     groups: Sequence[str], current: FairgateConfig) -> ConfigMapVerdict:
    target = f"{CONTROL_NAMESPACE}/{PLATFORM_CONFIGMAP}"
    if not authz.is_platform_admin(current.platform, user, groups):
        return _deny(f"{who} may not {_verb(operation)} {target}: only platform admins "
                     f"(platformAdmins in {PLATFORM_CONFIGMAP}) may")
    before = _document_or_empty(old_data, PLATFORM_KEY, MAX_DOCUMENT_BYTES, None)
    if operation == "DELETE":
        return ConfigMapVerdict(
            allowed=True, audit_diff=field_diff(before, {}),
            warnings=("without fairgate-platform no tenant is known: GPU pods are denied "
                      "until it is recreated",),
        )
    source = f"ConfigMap {target} key {PLATFORM_KEY}"
    problems = _data_key_problems(new_data, PLATFORM_KEY, PLATFORM_CONFIGMAP)
    if problems:
        return _deny(str(ConfigError(source, problems)))
    text = (new_data or {})[PLATFORM_KEY]
    try:
        platform = parse_platform(text, source)
    except ConfigError as exc:
        return _deny(str(exc))
    problems = _ceiling_problems(platform, current)
    if problems:
        return _deny(str(ConfigError(source, problems)))
    warnings: tuple[str, ...] = ()
    if not authz.is_platform_admin(platform, user, groups):
        warnings = ("after this change you are no longer a platform admin "
                    "(platformAdmins does not list you)",)
    return ConfigMapVerdict(allowed=True, warnings=warnings,
                            audit_diff=field_diff(before, load_yaml_mapping(text, source)))


def _ceiling_problems(platform: PlatformConfig, current: FairgateConfig) -> list[Problem]:
    problems: list[Problem] = []
    for tenant, quota in sorted(current.quotas.items()):
        if tenant not in current.platform.tenants:
            continue
        spec = platform.tenants.get(tenant)
        nominal = resources.gpu_equivalents(quota.nominal_slices)
        if spec is None:
            problems.append(Problem(
                f"tenants.{tenant}",
                f"removed while {QUOTA_CONFIGMAP_PREFIX}{tenant} exists: delete that "
                f"ConfigMap first",
            ))
        elif quota.nominal_slices > spec.ceiling.slices:
            problems.append(Problem(
                f"tenants.{tenant}.ceiling.gpuEquivalents",
                f"{spec.ceiling.gpu_equivalents} is below the nominal quota of tenant "
                f"{tenant!r} ({nominal} GPU-eq in {QUOTA_CONFIGMAP_PREFIX}{tenant}): lower "
                f"that quota first",
            ))
        elif quota.nominal_slices + quota.borrow_limit.slices > spec.ceiling.slices:
            eq = resources.gpu_equivalents
            borrow = quota.borrow_limit.slices
            problems.append(Problem(
                f"tenants.{tenant}.ceiling.gpuEquivalents",
                f"{spec.ceiling.gpu_equivalents} is below nominal + borrowLimit of tenant "
                f"{tenant!r} ({nominal} + {eq(borrow)} = {eq(quota.nominal_slices + borrow)} "
                f"GPU-eq in {QUOTA_CONFIGMAP_PREFIX}{tenant}): lower that quota's borrowLimit "
                f"first",
            ))
    return problems


def _review_quota(operation: str, tenant: str, new_data: Mapping[str, str] | None,
                  old_data: Mapping[str, str] | None, who: str, user: str,
                  groups: Sequence[str], labels: Mapping[str, str], current: FairgateConfig,
                  usage: Mapping[str, int] | None) -> ConfigMapVerdict:
    name = f"{QUOTA_CONFIGMAP_PREFIX}{tenant}"
    target = f"{CONTROL_NAMESPACE}/{name}"
    platform = current.platform
    before = _document_or_empty(old_data, QUOTA_KEY, MAX_QUOTA_BYTES, MAX_QUOTA_NODES)
    if operation == "DELETE":
        if not authz.is_platform_admin(platform, user, groups):
            return _deny(f"{who} may not delete {target}: only platform admins may; to "
                         f"take the quota away set 'nominal: {{}}' instead", tenant)
        return ConfigMapVerdict(allowed=True, tenant=tenant, audit_diff=field_diff(before, {}))
    if not authz.may_write_quota(platform, tenant, user, groups):
        unknown = ("" if tenant in platform.tenants
                   else f" (tenant {tenant!r} is not defined in {PLATFORM_CONFIGMAP})")
        return _deny(f"{who} may not {_verb(operation)} {target}: only {tenant}'s admins or "
                     f"platform admins may{unknown}", tenant)
    source = f"ConfigMap {target} key {QUOTA_KEY}"
    problems = _data_key_problems(new_data, QUOTA_KEY, name)
    if labels.get(QUOTA_LABEL) != tenant:
        problems.append(Problem(
            f"metadata.labels.{QUOTA_LABEL}",
            f"must be {tenant!r} (the tenant the name {name} names): set label "
            f"'{QUOTA_LABEL}: {tenant}'",
        ))
    text = (new_data or {}).get(QUOTA_KEY)
    quota = None
    if text is not None:
        try:
            quota = parse_quota(text, tenant, platform, source)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems or quota is None:
        return _deny(str(ConfigError(source, problems)), tenant)
    warnings: list[str] = []
    used = (usage or {}).get(tenant, 0)
    if quota.nominal_slices < used:
        warnings.append(_fit(
            f"{name}: nominal {resources.gpu_equivalents(quota.nominal_slices)} GPU-eq is "
            f"below current usage {resources.gpu_equivalents(used)}; nothing is evicted, "
            f"new pods wait"
        ))
    return ConfigMapVerdict(allowed=True, tenant=tenant, warnings=tuple(warnings),
                            audit_diff=field_diff(before, load_yaml_mapping(
                                text or "", source, MAX_QUOTA_BYTES, MAX_QUOTA_NODES)))


def _data_key_problems(data: Mapping[str, str] | None, key: str, name: str) -> list[Problem]:
    problems = [
        Problem(f"data.{extra}", f"unknown key: {name} holds only '{key}'")
        for extra in sorted(data or {}) if extra != key
    ]
    if key not in (data or {}):
        problems.insert(0, Problem("data", f"missing key '{key}': put the YAML document under it"))
    return problems


def _document_or_empty(data: Mapping[str, str] | None, key: str, max_bytes: int,
                       max_nodes: int | None) -> dict[str, Any]:
    """The YAML mapping under ``key``, or {} if absent, over the limits or unreadable
    (a broken old version)."""
    try:
        return load_yaml_mapping((data or {}).get(key, ""), key, max_bytes, max_nodes)
    except ConfigError:
        return {}


def field_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> FieldDiff:
    """Changed leaf fields, by dotted path: ``{"nominal.gpu": {"before": 8, "after": 4}}``."""
    old, new = _flatten(before), _flatten(after)
    return {
        path: {"before": old.get(path), "after": new.get(path)}
        for path in sorted(old.keys() | new.keys())
        if old.get(path) != new.get(path) or (path in old) != (path in new)
    }


def _flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{prefix}{key}"
        if isinstance(item, Mapping) and item:
            flat.update(_flatten(item, path + "."))
        else:
            flat[path] = item
    return flat


def _verb(operation: str) -> str:
    return {"CREATE": "create", "UPDATE": "change", "DELETE": "delete"}.get(
        operation, operation.lower()
    )


def _fit(text: str) -> str:
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 3] + "..."


def _deny(message: str, tenant: str | None = None) -> ConfigMapVerdict:
    return ConfigMapVerdict(allowed=False, message=message, tenant=tenant, ours=True)


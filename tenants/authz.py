"""Who may change fairgate's ConfigMaps, decided from the request's ``userInfo``.

Contract (defence in depth on top of RBAC; every function is pure):
- *Platform admins* are the users and groups under ``platformAdmins`` in the current
  (last good) ``fairgate-platform``, plus two kinds of principal that are trusted anyway:
  members of ``system:masters`` (cluster superusers: they bypass RBAC and could remove
  the webhook; they are also the only way to create the first ``fairgate-platform``) and
  fairgate's own ServiceAccounts ``fairgate-webhook`` and ``fairgate-dispatcher`` in
  ``fairgate-system`` (used by installers and the demo).
- Platform admins may create, update and delete ``fairgate-platform`` and every quota.
- A tenant's admins (``tenants.<name>.admins``) may create and update ``quota-<name>``
  only; nobody else may, and only platform admins may delete a quota.
Authorisation always uses the current config, never the edit being reviewed, so an
edit cannot grant its author the right to make it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tenants.models import CONTROL_NAMESPACE, DISPATCHER_USER, PlatformConfig

WEBHOOK_USER = f"system:serviceaccount:{CONTROL_NAMESPACE}:fairgate-webhook"
FAIRGATE_USERS: frozenset[str] = frozenset({WEBHOOK_USER, DISPATCHER_USER})
SUPERUSER_GROUP = "system:masters"


def is_fairgate(user: str) -> bool:
    """Whether ``user`` is one of fairgate's own ServiceAccounts."""
    return user in FAIRGATE_USERS


def is_platform_admin(platform: PlatformConfig, user: str, groups: Sequence[str]) -> bool:
    """Whether the requester may act as a platform admin (see the module doc)."""
    return (
        is_fairgate(user)
        or SUPERUSER_GROUP in groups
        or platform.platform_admins.permits(user, tuple(groups))
    )


def is_tenant_admin(platform: PlatformConfig, tenant: str, user: str,
                    groups: Sequence[str]) -> bool:
    """Whether the requester is listed as an admin of ``tenant`` (not platform admins)."""
    spec = platform.tenants.get(tenant)
    return spec is not None and spec.admins.permits(user, tuple(groups))


def may_write_quota(platform: PlatformConfig, tenant: str, user: str,
                    groups: Sequence[str]) -> bool:
    """Whether the requester may create or update ``quota-<tenant>``."""
    return is_platform_admin(platform, user, groups) or is_tenant_admin(
        platform, tenant, user, groups
    )


def describe(user: str, groups: Sequence[str]) -> str:
    """The requester in messages: user and groups, without system-wide noise groups."""
    shown = [g for g in groups if g not in ("system:authenticated",)]
    return f"user {user!r}" + (f" (groups: {', '.join(shown)})" if shown else "")

"""Who is looking at the console, and which tenants they may see.

Contract:
- A :class:`Viewer` sees every tenant (``everything``) or only the tenants in
  ``tenants``. Every page, API route and the event stream filters by
  :meth:`Viewer.sees`; data of a tenant the viewer may not see never leaves the server.
- :class:`TokenAccess` (local mode): one random token (``secrets.token_urlsafe``);
  a request presenting it (``?token=``, the ``fairgate_console`` cookie, or
  ``Authorization: Bearer``) sees everything, any other request is refused.
- :class:`KubernetesAccess` (in a cluster): the request's bearer token (``Authorization:
  Bearer``, or ``?token=`` / the cookie after a first visit) is checked with a
  TokenReview; what the user sees is decided with SubjectAccessReviews against the
  control namespace: may the user ``get`` ConfigMaps there (any name)? then every
  tenant (a platform admin); otherwise each tenant ``t`` whose ``quota-<t>`` ConfigMap
  the user may ``get`` (a tenant admin can read its own quota). A user seeing no tenant
  is refused (403). So the console shows exactly what ``kubectl`` would let that user
  read. TokenReviews and visibility are cached for ``ttl`` seconds, at most
  ``max_entries`` each (least recently used dropped first).
- :meth:`authenticate` raises :class:`Denied` (``status`` 401 or 403, ``message`` saying
  how to get in; 503 when the API server cannot answer); it blocks (network), so the app
  calls it in a worker thread.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, Protocol, TypeVar

from tenants.models import CONTROL_NAMESPACE, QUOTA_CONFIGMAP_PREFIX

COOKIE = "fairgate_console"
"""The cookie holding the access token after a first visit with ``?token=``."""

V = TypeVar("V")


@dataclass(frozen=True)
class Viewer:
    """A user of the console and the tenants they may see."""

    name: str
    everything: bool = False
    tenants: frozenset[str] = field(default_factory=frozenset)

    def sees(self, tenant: str) -> bool:
        """Whether data of ``tenant`` may be shown to this viewer."""
        return self.everything or tenant in self.tenants

    def visible(self, tenants: Iterable[str]) -> list[str]:
        """``tenants`` this viewer may see, order kept."""
        return [t for t in tenants if self.sees(t)]


class Denied(Exception):
    """The request may not see the console: ``status`` 401 (who are you?) or 403."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Access(Protocol):
    """Decides who a request is."""

    def authenticate(self, token: str | None) -> Viewer:
        """The viewer presenting ``token``; raises :class:`Denied`."""


def token_of(query: Mapping[str, str], cookies: Mapping[str, str],
             headers: Mapping[str, str]) -> str | None:
    """The token a request presents: ``Authorization: Bearer``, then ``?token=``, then
    the cookie."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return query.get("token") or cookies.get(COOKIE) or None


class TokenAccess:
    """Local mode: one random token sees everything."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(24)

    def authenticate(self, token: str | None) -> Viewer:
        """The local viewer if ``token`` is the console's token."""
        if token is None:
            raise Denied(401, "this console needs its access token: open the URL printed "
                         "in the `console: ...` line (it ends with ?token=...)")
        if not secrets.compare_digest(token.encode(), self.token.encode()):
            raise Denied(401, "wrong access token: open the URL printed in the "
                         "`console: ...` line of this `fairgate console`")
        return Viewer("local", everything=True)


class TtlCache(Generic[V]):
    """A bounded map whose entries live ``ttl`` seconds (thread-safe)."""

    def __init__(self, ttl: float, max_entries: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str) -> V | None:
        """The live value of ``key``, if any."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if item[0] <= self._clock():
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: str, value: V) -> None:
        """Store ``value`` for ``ttl`` seconds, dropping the least recently used entry
        beyond ``max_entries``."""
        with self._lock:
            self._items[key] = (self._clock() + self.ttl, value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


@dataclass(frozen=True)
class _User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, list[str]]


class KubernetesAccess:
    """In a cluster: TokenReview for who, SubjectAccessReview for which tenants.

    ``tenants`` returns the tenant names to decide about (those the queue knows);
    ``api`` is a ``kubernetes.client.ApiClient``.
    """

    def __init__(self, api: Any, tenants: Callable[[], list[str]],
                 namespace: str = CONTROL_NAMESPACE, ttl: float = 30.0,
                 max_entries: int = 1024, workers: int = 8) -> None:
        from kubernetes import client

        self._auth = client.AuthenticationV1Api(api)
        self._authz = client.AuthorizationV1Api(api)
        self._client = client
        self._tenants = tenants
        self.namespace = namespace
        self._users: TtlCache[_User] = TtlCache(ttl, max_entries)
        self._viewers: TtlCache[Viewer] = TtlCache(ttl, max_entries)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="console-sar")

    def authenticate(self, token: str | None) -> Viewer:
        """The viewer presenting the bearer ``token``; :class:`Denied` (503) when the API
        server cannot answer the reviews."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return self._authenticate(token)
        except (ApiException, HTTPError, OSError) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            raise Denied(503, f"cannot check access with the API server ({reason}): the "
                         "console's ServiceAccount needs create on tokenreviews and "
                         "subjectaccessreviews (manifests/console.yaml)") from exc

    def _authenticate(self, token: str | None) -> Viewer:
        if token is None:
            raise Denied(401, "send your Kubernetes bearer token: `Authorization: Bearer "
                         "<token>` (e.g. from `kubectl create token`), or open the console "
                         "once with ?token=<token>")
        user = self._review(token)
        key = "\0".join((user.name, user.uid, *user.groups))
        viewer = self._viewers.get(key)
        if viewer is None:
            viewer = self._decide(user)
            self._viewers.put(key, viewer)
        if not viewer.everything and not viewer.tenants:
            raise Denied(403, f"{user.name} may not read any tenant's quota ConfigMap "
                         f"(quota-<tenant> in {self.namespace}): ask a platform admin for "
                         "a Role granting get on it")
        return viewer

    def _review(self, token: str) -> _User:
        digest = hashlib.sha256(token.encode()).hexdigest()
        user = self._users.get(digest)
        if user is not None:
            return user
        c = self._client
        review = self._auth.create_token_review(
            c.V1TokenReview(spec=c.V1TokenReviewSpec(token=token)))
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            raise Denied(401, "the API server did not accept this token (TokenReview): "
                         "send a valid, unexpired bearer token")
        info = status.user
        user = _User(info.username or "", info.uid or "", tuple(info.groups or ()),
                     dict(info.extra or {}))
        self._users.put(digest, user)
        return user

    def _allowed(self, user: _User, name: str) -> bool:
        c = self._client
        attrs = c.V1ResourceAttributes(namespace=self.namespace, verb="get",
                                       resource="configmaps", name=name or None)
        review = self._authz.create_subject_access_review(c.V1SubjectAccessReview(
            spec=c.V1SubjectAccessReviewSpec(user=user.name, uid=user.uid or None,
                                             groups=list(user.groups),
                                             extra=user.extra or None,
                                             resource_attributes=attrs)))
        return bool(review.status is not None and review.status.allowed)

    def _decide(self, user: _User) -> Viewer:
        if self._allowed(user, ""):
            return Viewer(user.name, everything=True)
        names = self._tenants()
        verdicts = self._pool.map(
            lambda t: self._allowed(user, QUOTA_CONFIGMAP_PREFIX + t), names)
        seen = frozenset(t for t, ok in zip(names, verdicts, strict=True) if ok)
        return Viewer(user.name, tenants=seen)


HIDDEN = "(another tenant)"
"""What a hidden word is shown as."""

_NAMESPACE_REF = re.compile(r"(?<![\w.-])([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)/[\w@.-]")
"""``<namespace>/<name>``: a namespace is one DNS label (no dots, unlike ``nvidia.com/``)."""
_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")

Owners = Callable[[str], "frozenset[str] | None"]
"""The tenants a namespace belongs to (None: not known)."""


@lru_cache(maxsize=64)
def _hidden_pattern(hidden: frozenset[str]) -> re.Pattern[str] | None:
    if not hidden:
        return None
    names = sorted(hidden, key=len, reverse=True)
    return re.compile("|".join(re.escape(n) for n in names))


class Redactor:
    """What of free text (an audit record's ``reason`` and ``diff``, a queue row's
    ``why``) a viewer may read: by what the viewer may see, not only by spelling. Every
    word (text between spaces) is shown as :data:`HIDDEN` when it

    - contains the name of a tenant the viewer may not see (one of ``tenants``);
    - contains a namespace of such a tenant (``owners``: the namespace index and the
      config's namespace labels), a tenant's namespace being named with or without its
      pods (``team-a-dev`` as ``prod``);
    - refers to an object as ``<namespace>/<name>`` (a pod, a gang) in a namespace not
      known to belong only to tenants the viewer sees, unless ``<namespace>`` is the name
      of a tenant the viewer sees (``team-b/training``, a queue) or the control
      namespace (fairgate's own ConfigMaps): a pod of an unknown namespace is not shown.

    Errs on hiding too much, never too little; a viewer of everything sees it all as it is.
    """

    def __init__(self, viewer: Viewer, tenants: Iterable[str],
                 owners: Owners = lambda _namespace: None) -> None:
        self.viewer = viewer
        self._owners = owners
        known = frozenset(tenants)
        self._names = _hidden_pattern(frozenset(t for t in known if not viewer.sees(t)))
        self._visible = frozenset(t for t in known if viewer.sees(t)) | viewer.tenants

    @property
    def everything(self) -> bool:
        """Whether nothing is hidden (the viewer sees every tenant)."""
        return self.viewer.everything

    def text(self, text: str) -> str:
        """``text`` with every word the viewer may not read hidden."""
        if self.viewer.everything or not text:
            return text
        return " ".join(HIDDEN if self._hides(word) else word for word in text.split(" "))

    def value(self, value: Any) -> Any:
        """A JSON value (a ``diff``) with :meth:`text` applied to every string in it,
        keys included."""
        if self.viewer.everything:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value

    def record(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """An audit record's (or event's) wire ``fields`` as the viewer may see them: the
        free text (``reason``, ``diff``) redacted; the rest is of the record's own tenant,
        which the viewer sees."""
        shown = dict(fields)
        if self.viewer.everything:
            return shown
        if shown.get("reason"):
            shown["reason"] = self.text(str(shown["reason"]))
        if shown.get("diff") is not None:
            shown["diff"] = self.value(shown["diff"])
        return shown

    def _hides(self, word: str) -> bool:
        if self._names is not None and self._names.search(word):
            return True
        lower = word.lower()
        for label in _LABEL.findall(lower):
            owners = self._owners(label)
            if owners and not owners <= self._visible:
                return True
        for namespace in _NAMESPACE_REF.findall(lower):
            if namespace in self._visible or namespace == CONTROL_NAMESPACE:
                continue  # <tenant>/<class> (a queue the viewer sees); fairgate's own
            owners = self._owners(namespace)
            if not owners or not owners <= self._visible:
                return True
        return False

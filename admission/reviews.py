"""AdmissionReview v1 as the API server sends it, and the responses fairgate returns.

Contract:
- :func:`parse_review` turns a request body into an :class:`AdmissionReview`, or raises
  :class:`InvalidReview` with a message saying which field is wrong. Unknown fields are
  accepted (the API server may add some); the types of the fields fairgate reads are
  checked strictly (no string-to-bool coercion, ``uid`` must be a string, ...).
- :func:`allow`, :func:`deny` and :func:`with_patch` build a complete response review
  (``apiVersion: admission.k8s.io/v1``, ``kind: AdmissionReview``, ``response.uid``
  echoing the request). Serialise it with :meth:`AdmissionReviewResponse.to_json`.
- Every warning is one line of at most :data:`MAX_WARNING_CHARS` characters (longer ones
  are cut and end in ``...``); empty and duplicate warnings are dropped.
- ``auditAnnotations`` keys are bare names (``decision``, ``tenant``, ``reason``): the API
  server prefixes them with the webhook name, so a key containing ``/`` (or anything but
  ``[A-Za-z0-9][-A-Za-z0-9_.]*``, at most 63 characters) is a programming error and raises
  ``ValueError``. Values are single lines of at most :data:`MAX_AUDIT_VALUE_CHARS`.
- The patch is a JSON Patch (RFC 6902) list, sent base64-encoded with
  ``patchType: JSONPatch``; an empty list sends no patch at all.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
MAX_WARNING_CHARS = 120
MAX_AUDIT_VALUE_CHARS = 256
_ELLIPSIS = "..."
_AUDIT_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
JsonObject = dict[str, Any]


class _Incoming(BaseModel):
    """Fields we read are typed strictly; fields we do not know are kept, not refused."""

    model_config = ConfigDict(
        extra="allow", strict=True, populate_by_name=True, frozen=True, alias_generator=to_camel
    )


class GroupVersionKind(_Incoming):
    """``kind`` / ``requestKind`` of a request (``group`` is empty for the core group)."""

    group: str = ""
    version: str
    kind: str


class GroupVersionResource(_Incoming):
    """``resource`` / ``requestResource`` of a request."""

    group: str = ""
    version: str
    resource: str


class UserInfo(_Incoming):
    """Who sent the request, as authenticated by the API server."""

    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class AdmissionRequest(_Incoming):
    """``request`` of an AdmissionReview v1. ``object`` / ``oldObject`` are raw JSON."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str = ""
    request_kind: GroupVersionKind | None = None
    request_resource: GroupVersionResource | None = None
    request_sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    operation: Operation
    user_info: UserInfo
    object: JsonObject | None = None
    old_object: JsonObject | None = None
    dry_run: bool = False
    options: JsonObject | None = None


class AdmissionReview(_Incoming):
    """An AdmissionReview v1 request as POSTed by the API server."""

    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class InvalidReview(ValueError):
    """A request body that is not an AdmissionReview v1; the message says why."""


def parse_review(body: bytes | str | Mapping[str, Any]) -> AdmissionReview:
    """Parse a request body (JSON text or decoded mapping) as an AdmissionReview v1."""
    try:
        if isinstance(body, Mapping):
            return AdmissionReview.model_validate(dict(body))
        return AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(part) for part in error["loc"]) or "body"
            problems.append(f"{where}: {error['msg']}")
        raise InvalidReview(
            "not an AdmissionReview v1 (apiVersion admission.k8s.io/v1): " + "; ".join(problems)
        ) from exc


class _Outgoing(BaseModel):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, alias_generator=to_camel
    )


class ResponseStatus(_Outgoing):
    """``response.status``: shown to the user when the request is denied."""

    code: int
    message: str
    reason: str = ""


class AdmissionResponse(_Outgoing):
    """``response`` of an AdmissionReview v1."""

    uid: str
    allowed: bool
    status: ResponseStatus | None = None
    patch: str | None = None
    patch_type: Literal["JSONPatch"] | None = None
    warnings: tuple[str, ...] | None = None
    audit_annotations: dict[str, str] | None = None


class AdmissionReviewResponse(_Outgoing):
    """A complete response review, ready to serialise."""

    api_version: Literal["admission.k8s.io/v1"] = API_VERSION
    kind: Literal["AdmissionReview"] = KIND
    response: AdmissionResponse

    def to_json(self) -> JsonObject:
        """The review as the JSON object the API server expects (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def clean_warning(text: str) -> str:
    """One line of at most MAX_WARNING_CHARS characters (cut with a trailing '...')."""
    return one_line(text, MAX_WARNING_CHARS)


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (control characters and runs of spaces become one space),
    cut to at most ``limit`` characters with a trailing '...', between words (inside a
    word only when its first word alone is too long)."""
    line = " ".join(_CONTROL.sub(" ", text).split())
    if len(line) <= limit:
        return line
    head = line[: limit - len(_ELLIPSIS) + 1]
    cut = head.rfind(" ")
    kept = head[:cut] if cut > 0 else head[:-1]
    return kept.rstrip(" ,;:") + _ELLIPSIS


def _warnings(warnings: Iterable[str]) -> tuple[str, ...] | None:
    cleaned: list[str] = []
    for text in warnings:
        line = clean_warning(text)
        if line and line not in cleaned:
            cleaned.append(line)
    return tuple(cleaned) or None


def _audit(audit: Mapping[str, str] | None) -> dict[str, str] | None:
    if not audit:
        return None
    for key in audit:
        if not _AUDIT_KEY.match(key):
            raise ValueError(
                f"auditAnnotations key {key!r} is invalid: use a bare name such as 'decision' "
                "(no '/', at most 63 of [A-Za-z0-9-_.]); the API server adds the prefix"
            )
    return {key: one_line(value, MAX_AUDIT_VALUE_CHARS) for key, value in audit.items()}


def _review(response: AdmissionResponse) -> AdmissionReviewResponse:
    return AdmissionReviewResponse(response=response)


def allow(
    uid: str, warnings: Iterable[str] = (), audit: Mapping[str, str] | None = None
) -> AdmissionReviewResponse:
    """Allow the request unchanged."""
    return _review(
        AdmissionResponse(
            uid=uid, allowed=True, warnings=_warnings(warnings), audit_annotations=_audit(audit)
        )
    )


def deny(
    uid: str,
    message: str,
    code: int = 403,
    reason: str = "Forbidden",
    warnings: Iterable[str] = (),
    audit: Mapping[str, str] | None = None,
) -> AdmissionReviewResponse:
    """Deny the request; ``message`` is what kubectl prints after the webhook's name."""
    return _review(
        AdmissionResponse(
            uid=uid,
            allowed=False,
            status=ResponseStatus(code=code, message=message, reason=reason),
            warnings=_warnings(warnings),
            audit_annotations=_audit(audit),
        )
    )


def encode_patch(ops: Sequence[Mapping[str, Any]]) -> str:
    """A JSON Patch as the base64 text of ``response.patch``."""
    return base64.b64encode(json.dumps(list(ops), separators=(",", ":")).encode()).decode()


def with_patch(
    uid: str,
    ops: Sequence[Mapping[str, Any]],
    warnings: Iterable[str] = (),
    audit: Mapping[str, str] | None = None,
) -> AdmissionReviewResponse:
    """Allow the request with a JSON Patch (none is sent when ``ops`` is empty)."""
    return _review(
        AdmissionResponse(
            uid=uid,
            allowed=True,
            patch=encode_patch(ops) if ops else None,
            patch_type="JSONPatch" if ops else None,
            warnings=_warnings(warnings),
            audit_annotations=_audit(audit),
        )
    )

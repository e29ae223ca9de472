"""AdmissionReview v1 request parsing and response building."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from admission_kit import FIXTURES, load_review

from admission.reviews import (
    MAX_AUDIT_VALUE_CHARS,
    MAX_WARNING_CHARS,
    AdmissionReviewResponse,
    InvalidReview,
    allow,
    clean_warning,
    deny,
    parse_review,
    with_patch,
)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_every_fixture_parses_from_bytes_and_mapping(path: Any) -> None:
    raw = path.read_bytes()
    from_bytes = parse_review(raw)
    assert from_bytes == parse_review(json.loads(raw)) == parse_review(raw.decode())
    request = from_bytes.request
    assert request.kind.kind == "Pod" and request.resource.resource == "pods"
    assert request.request_kind is not None and request.request_kind.version == "v1"
    assert request.object is not None and request.object["kind"] == "Pod"
    assert request.user_info.username


def test_fields_are_read_with_their_types() -> None:
    request = parse_review(load_review("gate_removal_update")).request
    assert request.uid == "f7a8b9c0-d1e2-4f3a-b4c5-d6e7f8a9b006"
    assert request.operation == "UPDATE"
    assert request.namespace == "team-a-train" and request.name == "gpu-smoke"
    assert request.user_info.groups == ["team-a-devs", "system:authenticated"]
    assert request.old_object is not None
    assert request.old_object["spec"]["schedulingGates"] == [{"name": "fairgate.io/queue"}]
    assert request.dry_run is False
    assert request.options == {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}
    assert request.sub_resource == ""


def test_unknown_fields_are_accepted() -> None:
    review = load_review("bare_create")
    review["futureTopLevel"] = 1
    review["request"]["futureField"] = {"x": 1}
    review["request"]["userInfo"]["futureUserField"] = "y"
    review["request"]["kind"]["extra"] = True
    assert parse_review(review).request.uid == "e5f6a7b8-c9d0-4e1f-a2b3-c4d5e6f7a805"


def test_minimal_request_defaults() -> None:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"version": "v1", "kind": "Pod"},
            "resource": {"version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "userInfo": {},
        },
    }
    request = parse_review(review).request
    assert request.object is None and request.old_object is None
    assert request.dry_run is False and request.namespace == "" and request.user_info.groups == []
    assert request.kind.group == ""


def _broken(path: list[str], value: Any) -> dict[str, Any]:
    review = load_review("bare_create")
    target = review
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return review


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (["apiVersion"], "admission.k8s.io/v1beta1", "apiVersion"),
        (["kind"], "AdmissionRequest", "kind"),
        (["request"], _DELETE, "request"),
        (["request", "uid"], 42, "request.uid"),
        (["request", "uid"], "", "request.uid"),
        (["request", "dryRun"], "true", "request.dryRun"),
        (["request", "operation"], "PATCH", "request.operation"),
        (["request", "object"], ["not", "an", "object"], "request.object"),
        (["request", "userInfo", "groups"], "team-a-devs", "request.userInfo.groups"),
        (["request", "userInfo", "username"], None, "request.userInfo.username"),
        (["request", "kind"], "Pod", "request.kind"),
        (["request", "namespace"], 7, "request.namespace"),
    ],
)
def test_wrong_types_are_refused_naming_the_field(
    path: list[str], value: Any, fragment: str
) -> None:
    with pytest.raises(InvalidReview, match="not an AdmissionReview v1") as caught:
        parse_review(_broken(path, value))
    assert fragment in str(caught.value)


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b"null", "not json", b"\xff\xfe"])
def test_unparseable_bodies_are_invalid_reviews(body: bytes | str) -> None:
    with pytest.raises(InvalidReview):
        parse_review(body)


def test_allow_response() -> None:
    assert allow("u1").to_json() == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u1", "allowed": True},
    }


def test_deny_response() -> None:
    body = deny("u2", "namespace x has no label", audit={"decision": "deny"}).to_json()
    assert body["response"] == {
        "uid": "u2",
        "allowed": False,
        "status": {"code": 403, "message": "namespace x has no label", "reason": "Forbidden"},
        "auditAnnotations": {"decision": "deny"},
    }
    assert "patch" not in body["response"]


def test_patch_response_is_base64_json_patch() -> None:
    ops = [{"op": "add", "path": "/metadata/labels/fairgate.io~1tenant", "value": "team-a"}]
    body = with_patch(
        "u3",
        ops,
        warnings=["queued: team-a has 0.00 of 2.00 GPU-eq free"],
        audit={"decision": "queue", "tenant": "team-a", "reason": "over quota"},
    ).to_json()
    response = body["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == ops
    assert response["warnings"] == ["queued: team-a has 0.00 of 2.00 GPU-eq free"]
    assert response["auditAnnotations"]["tenant"] == "team-a"
    # round trip through the model
    assert AdmissionReviewResponse.model_validate(body).to_json() == body


def test_empty_patch_sends_no_patch() -> None:
    response = with_patch("u4", []).to_json()["response"]
    assert "patch" not in response and "patchType" not in response and response["allowed"]


def test_warnings_are_short_single_lines_without_duplicates() -> None:
    long = "queued: " + "very " * 60 + "long"
    body = allow("u5", warnings=[long, long, "", "  ", "line one\nline\ttwo\x00"]).to_json()
    warnings = body["response"]["warnings"]
    assert warnings == [clean_warning(long), "line one line two"]
    assert all(len(w) <= MAX_WARNING_CHARS for w in warnings)
    assert warnings[0].endswith("...") and warnings[0].startswith("queued: very")


@pytest.mark.parametrize(
    "key", ["fairgate.io/decision", "", "-x", "a" * 64, "has space", "ünicode"]
)
def test_audit_keys_must_be_bare_names(key: str) -> None:
    with pytest.raises(ValueError, match="auditAnnotations key"):
        allow("u6", audit={key: "v"})


def test_audit_values_are_bounded() -> None:
    body = deny("u7", "no", audit={"reason": "x" * 1000 + "\n"}).to_json()
    assert len(body["response"]["auditAnnotations"]["reason"]) == MAX_AUDIT_VALUE_CHARS

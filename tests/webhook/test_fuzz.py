"""Hostile AdmissionReviews against the real ``fairgate serve``: the answer is always a
valid AdmissionReview echoing the uid, or a 4xx JSON error for unparseable bodies; never
a 5xx (hypothesis; a moderate number of examples here, the long run belongs in bench/)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook_helpers import gpu_pod, review

from webhook.process import ServeProcess

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                  max_size=4),
    max_leaves=20,
)
QUANTITIES = st.one_of(
    st.sampled_from(["1", "0", "-1", "1500m", "1e3", "2Ki", "0.5", "1E1", " 1", "", "∞"]),
    st.integers(-5, 10**12), st.floats(allow_nan=False, allow_infinity=False), JSON,
)
RESOURCES = st.sampled_from([
    "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-9g.1gb",
    "nvidia.com/mig-1g.10gb+me", "cpu", "memory", "amd.com/gpu",
])
NAMESPACES = st.sampled_from(["team-a-dev", "team-b-dev", "sandbox", "", "nowhere"])
PATHS = st.sampled_from(["/mutate", "/validate"])


@st.composite
def hostile_reviews(draw: st.DrawFn) -> dict[str, Any]:
    """A pod AdmissionReview with random resources, labels and one random field replaced."""
    limits = draw(st.dictionaries(RESOURCES, QUANTITIES, max_size=3))
    labels = draw(st.dictionaries(
        st.sampled_from(["fairgate.io/class", "fairgate.io/tenant", "fairgate.io/pod-group",
                         "app", "fairgate.io/ticket"]),
        st.text(max_size=12) | JSON, max_size=3))
    pod = gpu_pod(draw(NAMESPACES), "fuzz", limits=limits)  # type: ignore[arg-type]
    pod["metadata"]["labels"] = labels
    body = review(pod, namespace=pod["metadata"]["namespace"],
                  operation=draw(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])),
                  old=pod if draw(st.booleans()) else None, dry_run=draw(st.booleans()))
    target = draw(st.sampled_from([
        None, ("request", "object", "spec"), ("request", "object", "metadata"),
        ("request", "object", "spec", "containers"), ("request", "userInfo"),
        ("request", "kind"), ("request", "namespace"), ("request", "oldObject"),
        ("request", "object", "spec", "initContainers"),
    ]))
    if target is not None:
        parent: Any = body
        for key in target[:-1]:
            parent = parent[key]
        parent[target[-1]] = draw(JSON)
    return body


@pytest.mark.slow
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=hostile_reviews(), path=PATHS)
def test_hostile_reviews_never_get_a_5xx(
    shared_server: ServeProcess, body: dict[str, Any], path: str
) -> None:
    with shared_server.client() as client:
        reply = client.post(path, content=json.dumps(body).encode(),
                            headers={"content-type": "application/json"})
    assert reply.status_code < 500, reply.text
    if reply.status_code != 200:
        assert reply.status_code == 400 and reply.json()["error"]
        return
    answer = reply.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == body["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"]
        assert response["status"]["code"] != 500, response  # refused for a reason, no crash
    assert path == "/mutate" or "patch" not in response

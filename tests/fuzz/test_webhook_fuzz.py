"""Hostile AdmissionReviews against a real ``fairgate serve`` over HTTPS.

The oracle: every answer is a valid AdmissionReview v1 (HTTP 200, uid echoed, a patch
only from /mutate and only as base64 JSON Patch, a denial always with a message and never
as an internal error), or a 400 with a JSON error for a body that is not an intact
AdmissionReview, or a 413 for a body over the size limit (whatever it holds). Never a
5xx, never a dropped connection, and the server's memory stays bounded.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from conftest import examples, rss_bytes
from hostile import bodies
from hypothesis import HealthCheck, given, settings

from webhook.app import DEFAULT_DEADLINE_SECONDS as DEADLINE_SECONDS
from webhook.app import DEFAULT_MAX_BODY_BYTES as MAX_BODY_BYTES
from webhook.process import ServeProcess
from webhook.service import INTERNAL_ERROR_MESSAGE

pytestmark = pytest.mark.slow

RSS_LIMIT = 300 * 1024 * 1024  # bounded: the 3 MiB body limit caps what one request holds
INTERNAL = INTERNAL_ERROR_MESSAGE.split("{uid}")[0]


def assert_valid_answer(reply: httpx.Response, uid: str | None, path: str) -> None:
    """The oracle of the module docstring."""
    status = reply.status_code
    assert status in ((200,) if uid is not None else (200, 400, 413)), (status, reply.text[:300])
    if status != 200:
        error = reply.json()["error"]
        assert isinstance(error, str) and error
        return
    answer = reply.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert isinstance(response["uid"], str) and response["uid"]
    if uid is not None:
        assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if "patch" in response:
        assert path == "/mutate" and response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"], validate=True))
        assert isinstance(ops, list) and ops
        assert all(op["op"] in ("add", "replace", "remove", "test") for op in ops)
    else:
        assert "patchType" not in response
    if not response["allowed"]:
        message = response["status"]["message"]
        assert isinstance(message, str) and message
        # A decision that missed the webhook's deadline (a starved CPU) is answered with
        # the internal-error denial too (bugs.md B7-4); only a fast one is a real error.
        if reply.elapsed.total_seconds() < DEADLINE_SECONDS:
            assert not message.startswith(INTERNAL), message
            assert response["status"].get("code") != 500, response["status"]
    for warning in response.get("warnings", []):
        assert isinstance(warning, str) and "\n" not in warning


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@settings(max_examples=examples(150), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(body=bodies())
def test_hostile_reviews_get_a_valid_answer(
    fuzz_server: ServeProcess, fuzz_client: httpx.Client, path: str,
    body: tuple[bytes, str | None],
) -> None:
    assert fuzz_server.process is not None
    data, uid = body
    reply = fuzz_client.post(path, content=data, headers={"content-type": "application/json"})
    if len(data) > MAX_BODY_BYTES:  # even an intact review: refused by size, never read
        assert reply.status_code == 413, (reply.status_code, reply.text[:300])
        assert "limit" in reply.json()["error"]
    else:
        assert_valid_answer(reply, uid, path)
    assert rss_bytes(fuzz_server.process.pid) <= RSS_LIMIT


def test_oversized_body_gets_413_and_memory_stays_bounded(
    fuzz_server: ServeProcess, fuzz_client: httpx.Client
) -> None:
    assert fuzz_server.process is not None
    for size in (3 * 1024 * 1024 + 1, 16 * 1024 * 1024):
        reply = fuzz_client.post("/mutate", content=b"{" + b" " * size)
        assert reply.status_code == 413
        assert "limit" in reply.json()["error"]
    assert rss_bytes(fuzz_server.process.pid) <= RSS_LIMIT

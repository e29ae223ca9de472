"""An allow-all admission webhook on fairgate's server stack: the baseline that separates
what any webhook costs through the API server from what fairgate itself adds.

Usage: python bench/trivial_webhook.py CERT_DIR PORT

It serves ``/mutate`` and ``/validate`` over HTTPS with uvicorn and the TLS context of
:func:`certs.server_ssl_context` (as ``fairgate serve`` does), parses the AdmissionReview
JSON and answers ``allowed: true`` without a patch. A dry-run request gets one annotation
(``bench.fairgate.io/trivial``) so a dry-run probe can tell that the API server calls it;
real requests are never patched. :func:`trivial_configurations` turns fairgate's webhook
configurations into ones that call this server instead (same rules, selectors and
timeouts, so the API server does the same matching work).
"""

from __future__ import annotations

import base64
import copy
import json
import sys
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from certs import server_ssl_context
from webhook.server import KEEP_ALIVE_SECONDS

NAME = "trivial"
PORT = 8443  # the Service port its configurations name; fairgate's is 443
PROBE_ANNOTATION = "bench.fairgate.io/trivial"


def _probe_patch(obj: dict[str, Any]) -> str:
    """A JSON Patch adding PROBE_ANNOTATION (the whole map when the pod has none)."""
    if (obj.get("metadata") or {}).get("annotations"):
        op = {"op": "add", "path": "/metadata/annotations/"
              + PROBE_ANNOTATION.replace("/", "~1"), "value": "called"}
    else:
        op = {"op": "add", "path": "/metadata/annotations",
              "value": {PROBE_ANNOTATION: "called"}}
    return base64.b64encode(json.dumps([op]).encode()).decode()


def _review(body: dict[str, Any], patch: bool) -> Response:
    request = body.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    if patch and request.get("dryRun"):
        response.update(patchType="JSONPatch", patch=_probe_patch(request.get("object") or {}))
    payload = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "response": response}
    return Response(json.dumps(payload), media_type="application/json")


def create_app() -> FastAPI:
    """The allow-all app: ``POST /mutate`` (patches dry runs only), ``POST /validate``."""
    app = FastAPI()

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        return _review(await request.json(), patch=True)

    @app.post("/validate")
    async def validate(request: Request) -> Response:
        return _review(await request.json(), patch=False)

    return app


def trivial_configurations(fairgate_webhooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of fairgate's webhook configurations named ``trivial`` whose webhooks call
    port :data:`PORT` of the same Service (so the certificate's name still matches)."""
    result = []
    for obj in fairgate_webhooks:
        obj = copy.deepcopy(obj)
        obj["metadata"]["name"] = NAME
        for webhook in obj["webhooks"]:
            webhook["name"] = f"{NAME}-{webhook['name']}"
            webhook["clientConfig"]["service"]["port"] = PORT
        result.append(obj)
    return result


def main() -> None:
    cert_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    context = server_ssl_context(cert_dir)
    config = uvicorn.Config(
        create_app(), host="127.0.0.1", port=port,
        ssl_context_factory=lambda _config, _default: context,
        log_config=None, access_log=False, server_header=False, lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,  # as `fairgate serve`: same connection reuse
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()

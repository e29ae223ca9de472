"""The webhooks' CEL matchConditions send exactly fairgate's business.

Every case of `matchcases.CASES` is evaluated by cel-python and, in one batch,
by the API server's own CEL code (k8s.io/apiserver through kubetool): both must
give the expected answer, and evaluation must never error (an error would
refuse the request under failurePolicy Fail).

Where cel-python is not faithful (found by the cross-check below):
- `has(a.b.c)` with `b` absent is false in cel-python but an error ("no such
  key") in Kubernetes CEL. The expressions guard every level with its own
  has(), outermost first.
- cel-python has no `list != null` (Kubernetes CEL has heterogeneous
  equality). A pod that omits `containers` reaches Kubernetes CEL as
  `containers: null`, so the expressions test `type(x) == list`, which both
  engines evaluate alike.
- Reading a field of a null `oldObject` errors in both; has() on it is false in
  both. The expressions read `oldObject` only when the operation sets it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import celpy
import pytest
from manifest_objects import Obj
from matchcases import (
    CASES,
    MUTATE_PODS,
    VALIDATE_CLAIMS,
    VALIDATE_CONFIGMAPS,
    VALIDATE_PODS,
    VALIDATE_TEMPLATES,
    Case,
)

_ENV = celpy.Environment()


def _activation(case: Case) -> dict[str, Any]:
    request = {"operation": case.operation, "namespace": "team-a-dev", "name": ""}
    return {
        "object": celpy.json_to_cel(case.object),
        "oldObject": celpy.json_to_cel(case.old_object),
        "request": celpy.json_to_cel(request),
    }


def celpy_matches(conditions: list[Obj], case: Case) -> bool:
    """Whether every condition is true for ``case``, per cel-python.

    Raises AssertionError when an expression errors instead of giving a bool.
    """
    results = []
    for cond in conditions:
        program = _ENV.program(_ENV.compile(cond["expression"]))
        try:
            value = program.evaluate(_activation(case))
        except celpy.CELEvalError as exc:
            raise AssertionError(f"{cond['name']} errored on {case.id}: {exc}") from exc
        assert isinstance(value, celpy.celtypes.BoolType), (cond["name"], case.id, value)
        results.append(bool(value))
    return all(results)


def test_every_webhook_is_covered(webhooks: dict[str, Obj]) -> None:
    assert set(webhooks) == {MUTATE_PODS, VALIDATE_PODS, VALIDATE_CONFIGMAPS, VALIDATE_CLAIMS,
                             VALIDATE_TEMPLATES}
    assert {c.hook for c in CASES} == set(webhooks)
    for hook in webhooks.values():
        assert hook["matchConditions"], hook["name"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cel_python(webhooks: dict[str, Obj], case: Case) -> None:
    assert celpy_matches(webhooks[case.hook]["matchConditions"], case) is case.sent


@pytest.fixture(scope="module")
def kubernetes_results(webhooks: dict[str, Obj], kubetool: Path) -> dict[str, Obj]:
    """Each case's outcome from the API server's matcher, by case id."""
    hooks = []
    for name, hook in webhooks.items():
        cases = [c for c in CASES if c.hook == name]
        hooks.append(
            {
                "name": name,
                "conditions": hook["matchConditions"],
                "cases": [
                    {
                        "operation": c.operation,
                        "resource": c.resource,
                        "object": c.object,
                        "oldObject": c.old_object,
                    }
                    for c in cases
                ],
                "ids": [c.id for c in cases],
            }
        )
    proc = subprocess.run(
        [str(kubetool), "matchconditions"],
        input=json.dumps({"hooks": hooks}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["hooks"]
    results: dict[str, Obj] = {}
    for sent, got in zip(hooks, out, strict=True):
        assert got["compileErrors"] == [], got["compileErrors"]
        results.update(zip(sent["ids"], got["results"], strict=True))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kubernetes_cel(kubernetes_results: dict[str, Obj], case: Case) -> None:
    result = kubernetes_results[case.id]
    assert result["error"] == "", result["error"]
    assert result["matches"] is case.sent, result


def _kubernetes_eval(kubetool: Path, expression: str, case: Case) -> Obj:
    hook = {
        "name": "probe",
        "conditions": [{"name": "probe", "expression": expression}],
        "cases": [
            {
                "operation": case.operation,
                "resource": case.resource,
                "object": case.object,
                "oldObject": case.old_object,
            }
        ],
    }
    proc = subprocess.run(
        [str(kubetool), "matchconditions"],
        input=json.dumps({"hooks": [hook]}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: Obj = json.loads(proc.stdout)["hooks"][0]["results"][0]
    return result


_BARE_POD = Case(
    "bare", VALIDATE_PODS, "CREATE", {"spec": {"containers": [{"name": "a"}]}}, None, False
)


@pytest.mark.slow
def test_kubernetes_matcher_reports_errors(kubetool: Path) -> None:
    """The cross-check can fail: an unguarded field read errors in Kubernetes CEL."""
    result = _kubernetes_eval(kubetool, "object.spec.initContainers.exists(c, true)", _BARE_POD)
    assert result["matches"] is False
    assert "no such key" in result["error"]


@pytest.mark.slow
def test_has_with_a_missing_parent_is_where_the_engines_differ(kubetool: Path) -> None:
    """Why every level of a has() chain is guarded on its own."""
    expression = "has(object.spec.nodeSelector.zone)"
    assert celpy_matches([{"name": "c", "expression": expression}], _BARE_POD) is False
    assert "no such key" in _kubernetes_eval(kubetool, expression, _BARE_POD)["error"]


@pytest.mark.slow
def test_has_on_a_null_old_object_is_false_in_both(kubetool: Path) -> None:
    expression = "!has(oldObject.metadata)"
    assert celpy_matches([{"name": "c", "expression": expression}], _BARE_POD) is True
    result = _kubernetes_eval(kubetool, expression, _BARE_POD)
    assert (result["matches"], result["error"]) == (True, "")

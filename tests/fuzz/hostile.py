"""Hypothesis strategies for hostile AdmissionReview v1 bodies and hostile quota YAML.

Each strategy draws something an attacker, a buggy controller or a bit flip could send:
wrong JSON types anywhere in the envelope or the pod, missing fields, huge label maps,
thousands of containers, deep nesting, non-UTF-8 bytes, GPU quantities that are negative,
fractional (``1500m``), exponents (``1e3``), suffixed (``2Ki``) or absurdly large, and
YAML with anchors/alias bombs, tags, deep nesting and oversized documents.

:func:`bodies` yields ``(body_bytes, uid_or_None)``: ``uid`` is the request uid when the
body is an intact review (the answer must be an AdmissionReview echoing it), else None.
"""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import strategies as st

NAMESPACES = ["team-a-dev", "team-b-dev", "race-dev", "sandbox", "", "kube-system"]
GPU_RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.40gb",
                 "nvidia.com/mig-9g.1gb", "nvidia.com/mig-1g.10gb.me", "nvidia.com/",
                 "nvidia.com/GPU", "cpu", "memory"]
FAIRGATE_KEYS = ["fairgate.io/tenant", "fairgate.io/class", "fairgate.io/ticket",
                 "fairgate.io/demand", "fairgate.io/borrowed", "fairgate.io/pod-group",
                 "fairgate.io/pod-group-size"]

# Anything JSON can hold, nested a little.
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)

quantity_text = st.one_of(
    st.sampled_from(["1", "2", "0", "-1", "1500m", "1e3", "1E3", "1e-3", "0.5", "1.0", "2Ki",
                     "1M", "1Mi", "3G", "1n", "1u", "+1", " 1", "1 ", "", "NaN", "inf",
                     "0x10", "1_000", "\uff11", "9" * 40, "1e308", "1e309", "-0", "1.5e2m",
                     "12345678901234567890"]),
    st.from_regex(r"\A[-+]?[0-9]{0,6}(\.[0-9]{0,4})?([eE][-+]?[0-9]{1,3}|m|k|Ki|Mi|Gi|M|G|T|"
                  r"P|E|n|u)?\Z"),
)
quantities = st.one_of(quantity_text, json_scalars)


@st.composite
def resource_maps(draw: st.DrawFn) -> Any:
    """``limits``/``requests``: usually a map of resource names to quantities."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    names = st.one_of(st.sampled_from(GPU_RESOURCES), st.text(max_size=12))
    return draw(st.dictionaries(names, quantities, max_size=4))


@st.composite
def containers(draw: st.DrawFn) -> Any:
    """One container, or (rarely) something that is not one."""
    if draw(st.integers(0, 14)) == 0:
        return draw(json_values)
    container: dict[str, Any] = {"name": draw(st.text(string.ascii_lowercase, max_size=6)),
                                 "image": "x"}
    resources: dict[str, Any] = {}
    if draw(st.booleans()):
        resources["limits"] = draw(resource_maps())
    if draw(st.integers(0, 3)) == 0:
        resources["requests"] = draw(resource_maps())
    if draw(st.integers(0, 9)) == 0:
        container["resources"] = draw(json_values)
    else:
        container["resources"] = resources
    if draw(st.integers(0, 5)) == 0:
        container["restartPolicy"] = draw(st.one_of(st.just("Always"), json_scalars))
    return container


@st.composite
def label_maps(draw: st.DrawFn) -> Any:
    """Labels/annotations: fairgate's own keys, junk, wrong value types, sometimes huge."""
    if draw(st.integers(0, 29)) == 0:
        return {f"k{i}": "v" for i in range(5000)}
    size = draw(st.sampled_from([0, 1, 3, 5]))
    keys = st.one_of(st.sampled_from(FAIRGATE_KEYS), st.text(max_size=10))
    values = st.one_of(st.sampled_from(["inference", "training", "team-a", "true", "gpu=1",
                                        "x y", "4", "-1", "team-b"]), json_scalars)
    return draw(st.dictionaries(keys, values, max_size=size))


@st.composite
def pods(draw: st.DrawFn) -> Any:
    """A pod with hostile parts (or, rarely, not a pod at all)."""
    if draw(st.integers(0, 19)) == 0:
        return draw(json_values)
    many = draw(st.integers(0, 49)) == 0
    app = (draw(st.lists(containers(), min_size=1, max_size=1)) * 10_000 if many
           else draw(st.lists(containers(), max_size=4)))
    spec: dict[str, Any] = {"containers": app}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(), max_size=3))
    for key in ("priorityClassName", "priority", "schedulingGates", "affinity", "tolerations",
                "nodeSelector", "preemptionPolicy", "overhead"):
        if draw(st.integers(0, 7)) == 0:
            spec[key] = draw(json_values)
    metadata: dict[str, Any] = {"name": draw(st.text(max_size=10)),
                                "namespace": draw(st.sampled_from(NAMESPACES))}
    if draw(st.booleans()):
        metadata["labels"] = draw(label_maps())
    if draw(st.booleans()):
        metadata["annotations"] = draw(label_maps())
    if draw(st.integers(0, 5)) == 0:
        metadata["ownerReferences"] = draw(json_values)
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": metadata if draw(st.integers(0, 19)) else None,
                           "spec": spec if draw(st.integers(0, 19)) else draw(json_values)}
    return pod


_DEEP_MARK = "__fairgate_deep__"  # replaced by 2,000 nested objects once serialised
_DEEP = b'{"a":' * 2000 + b"1" + b"}" * 2000


OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


@st.composite
def reviews(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """An AdmissionReview v1 envelope with hostile content and random damage, and whether
    it is intact: a well-formed envelope (whatever the objects inside hold) that the
    webhook must answer with an AdmissionReview, not a 400."""
    obj = draw(pods())
    namespace = (obj.get("metadata") or {}).get("namespace", "team-a-dev") \
        if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) else "team-a-dev"
    kind = draw(st.sampled_from(["Pod", "Pod", "Pod", "ConfigMap", "Deployment"]))
    request: dict[str, Any] = {
        "uid": draw(st.one_of(st.uuids().map(str), st.text(max_size=12))),
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "subResource": draw(st.sampled_from([None, None, None, "status", "binding"])),
        "name": draw(st.text(max_size=10)),
        "namespace": namespace if isinstance(namespace, str) else "x",
        "operation": draw(st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT",
                                           "create", "PATCH"])),
        "userInfo": {"username": draw(st.sampled_from(
            ["alice", "system:serviceaccount:fairgate-system:fairgate-dispatcher", ""])),
            "groups": draw(st.lists(st.sampled_from(["platform-team", "team-a-admins",
                                                     "system:authenticated"]), max_size=2))},
        "object": obj,
        "oldObject": draw(st.one_of(st.none(), pods())),
        "dryRun": draw(st.booleans()),
    }
    if request["subResource"] is None:
        del request["subResource"]
    deep = draw(st.integers(0, 29)) == 0
    if deep:
        request["object"] = {"apiVersion": "v1", "kind": "Pod", "spec": _DEEP_MARK}
    intact = (not deep and request["operation"] in OPERATIONS and bool(request["uid"])
              and all(isinstance(request[k], dict | None) for k in ("object", "oldObject")))
    # Damage: drop or retype a field of the request or the envelope.
    damage = draw(st.integers(0, 2))
    intact = intact and damage == 0
    for _ in range(damage):
        key = draw(st.sampled_from(sorted(request)))
        if draw(st.booleans()):
            del request[key]
        else:
            request[key] = draw(json_values)
    envelope: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1",
                                "kind": "AdmissionReview", "request": request}
    if draw(st.integers(0, 19)) == 0:
        key = draw(st.sampled_from(sorted(envelope)))
        envelope[key] = draw(json_values)
        intact = False
    return envelope, intact


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """Request bytes (mostly JSON reviews, sometimes damaged bytes or not JSON at all) and
    the request uid when the body is an intact review (see :func:`reviews`), else None."""
    review, intact = draw(reviews())
    data = json.dumps(review).encode().replace(f'"{_DEEP_MARK}"'.encode(), _DEEP)
    how = draw(st.integers(0, 19))
    if how == 0:  # a non-UTF-8 byte somewhere
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80",
                                                 b"\x00"])) + data[at:]
    elif how == 1:  # cut short
        data = data[: draw(st.integers(0, len(data)))]
    elif how == 2:  # deep nesting at the top
        depth = draw(st.sampled_from([50, 1000, 100_000]))
        data = b'{"request":' * depth + b"1" + b"}" * depth
    elif how == 3:
        data = draw(st.binary(max_size=64))
    if how <= 3 or not intact:
        return data, None
    uid: str = review["request"]["uid"]
    return data, uid


# -- hostile YAML for the quota ConfigMap validator ------------------------------------

_ALIAS_BOMB = ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
               + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9)
                         + "]\n" for i in range(8)))
YAML_SEEDS = [
    _ALIAS_BOMB,
    "nominal: &n {gpu: 2}\nborrowLimit: *n\n",
    "nominal: {<<: {gpu: 1}}\n",
    "nominal: {gpu: !!python/object/apply:os.system [true]}\n",
    "nominal: {gpu: 1}\nnominal: {gpu: 2}\n",
    "nominal: {gpu: .nan}\n",
    "nominal: {gpu: 2001-12-14}\n",
    "nominal: {gpu: !!binary aGVsbG8=}\n",
    "nominal: {gpu: 1e3}\n",
    "nominal: {gpu: 1500m}\n",
    "nominal: {gpu: -1}\n",
    "nominal: {gpu: 0x10}\n",
    "--- {}\n--- {}\n",
    "x" * (300 * 1024),
    "nominal:\n" + "".join(f"  k{i}: {i}\n" for i in range(20_000)),
    "\t",
    "\x00",
    "nominal: {gpu: 1}\x85",
]
# Texts that once made tenants.schema.load_yaml_mapping raise something else than a
# ConfigError (bugs.md B7-1, fixed in 3927e52): pinned one by one by the tests, and drawn
# by ``quota_yaml`` too.
YAML_BUG_SEEDS = {
    "5000-digit integer": "nominal: {gpu: " + "9" * 5000 + "}\n",
    "5000 nested flow lists": "nominal: " + "[" * 5000 + "]" * 5000 + "\n",
    "3000 nested flow maps": "nominal: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
}
quota_yaml = st.one_of(
    st.sampled_from(YAML_SEEDS + list(YAML_BUG_SEEDS.values())),
    st.text(alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"#%@` \n\tabgpu0123456789.")),
            max_size=200),
    st.builds(lambda n, b, extra: f"nominal: {{gpu: {n}}}\nborrowLimit: {{gpuEquivalents: {b}}}"
              f"\n{extra}", quantity_text, quantity_text,
              st.sampled_from(["", "defaultClass: inference\n", "bogus: 1\n",
                               "inferenceReserve: {gpuEquivalents: 99}\n"])),
)

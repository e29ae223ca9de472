"""Hypothesis strategies for valid pods of every shape (tests/admission)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tenants.models import QUEUE_GATE

NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)
KEYS = st.one_of(
    NAMES,
    st.builds(lambda a, b: f"{a}.example.com/{b}", NAMES, NAMES),
    st.sampled_from(["a~b", "x/y~1z", "app.kubernetes.io/name", "fairgate.io/pod-group"]),
)
STRING_MAP = st.one_of(st.none(), st.dictionaries(KEYS, NAMES, max_size=4))
GPU_KEYS = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "cpu", "memory"])


def _container(name: str, sidecar: bool) -> st.SearchStrategy[dict[str, Any]]:
    body = st.fixed_dictionaries(
        {
            "name": st.just(name),
            "image": st.just("img"),
            "resources": st.fixed_dictionaries(
                {"limits": st.dictionaries(GPU_KEYS, st.integers(0, 4).map(str), max_size=3)}
            ),
        }
    )
    return body.map(lambda c: {**c, "restartPolicy": "Always"} if sidecar else c)


REQUIREMENT = st.fixed_dictionaries(
    {
        "key": KEYS,
        "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    }
).map(lambda r: r if r["operator"] in ("Exists", "DoesNotExist") else {**r, "values": ["v"]})
FIELD = st.fixed_dictionaries(
    {
        "key": st.just("metadata.name"),
        "operator": st.just("In"),
        "values": st.lists(NAMES, min_size=1, max_size=2),
    }
)
TERM = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(REQUIREMENT, max_size=3),
        "matchFields": st.lists(FIELD, max_size=2),
    },
)
TOLERATION = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from(["", "nvidia.com/gpu", "dedicated", "node.kubernetes.io/not-ready"]),
        "operator": st.sampled_from(["Exists", "Equal"]),
        "value": NAMES,
        "effect": st.sampled_from(["", "NoSchedule", "NoExecute", "PreferNoSchedule"]),
    },
)
AFFINITY = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "nodeAffinity": st.fixed_dictionaries(
                {},
                optional={
                    "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
                        {"nodeSelectorTerms": st.lists(TERM, max_size=4)}
                    ),
                    "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
                        st.fixed_dictionaries({"weight": st.integers(1, 100), "preference": TERM}),
                        max_size=2,
                    ),
                },
            ),
            "podAntiAffinity": st.just({"preferredDuringSchedulingIgnoredDuringExecution": []}),
        },
    ),
)


@st.composite
def pods(draw: st.DrawFn, namespace: str = "team-a-train") -> dict[str, Any]:
    """A pod with random containers, init containers, sidecars, labels, annotations,
    tolerations, affinity (several terms), gates and priority fields."""
    app = [draw(_container(f"app-{i}", False)) for i in range(draw(st.integers(1, 3)))]
    init = [
        draw(_container(f"init-{i}", draw(st.booleans()))) for i in range(draw(st.integers(0, 3)))
    ]
    metadata: dict[str, Any] = {"name": draw(NAMES), "namespace": namespace}
    for field in ("labels", "annotations"):
        value = draw(STRING_MAP)
        if value is not None or draw(st.booleans()):
            metadata[field] = value
    spec: dict[str, Any] = {"containers": app}
    if init:
        spec["initContainers"] = init
    optional = {
        "tolerations": st.one_of(st.none(), st.lists(TOLERATION, max_size=4)),
        "affinity": AFFINITY,
        "schedulingGates": st.one_of(
            st.none(),
            st.lists(
                st.sampled_from([QUEUE_GATE, "example.com/a", "example.com/b"]).map(
                    lambda n: {"name": n}
                ),
                max_size=3,
            ),
        ),
        "priorityClassName": st.one_of(st.none(), st.sampled_from(["high", "fairgate-training"])),
        "priority": st.one_of(st.none(), st.integers(0, 10**6)),
        "nodeSelector": st.one_of(st.none(), st.dictionaries(KEYS, NAMES, max_size=2)),
    }
    for field, strategy in optional.items():
        if draw(st.booleans()):
            spec[field] = draw(strategy)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

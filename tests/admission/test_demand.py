"""pod_demand: Kubernetes' effective-request rule for GPU and MIG resources."""

from __future__ import annotations

from typing import Any

import pytest
from admission_kit import container, gpu_pod, load_review
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.demand import DemandError, pod_demand
from admission.pods import PodError, PodView

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.5gb"


def pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": {"name": "p"}, "spec": spec}


def sidecar(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    return container(name, limits, restartPolicy="Always")


@pytest.mark.parametrize(
    ("spec_pod", "expected"),
    [
        (pod([container(limits={GPU: "1"})]), {"gpu": 1}),
        (pod([container("a", {GPU: 1}), container("b", {GPU: 2})]), {"gpu": 3}),
        # a regular init container bigger than the app containers wins
        (pod([container(limits={GPU: 1})], [container("init", {GPU: 4})]), {"gpu": 4}),
        # sidecars run alongside the app containers: they add up
        (pod([container(limits={GPU: 2})], [sidecar("s", {GPU: 1})]), {"gpu": 3}),
        # an init container after a sidecar runs next to it: 3 + 1 > 2 + 1
        (
            pod(
                [container(limits={GPU: 2})],
                [container("warm", {GPU: 2}), sidecar("s", {GPU: 1}), container("conv", {GPU: 3})],
            ),
            {"gpu": 4},
        ),
        # an init container before the sidecar does not run next to it
        (
            pod(
                [container(limits={GPU: 1})], [container("first", {GPU: 3}), sidecar("s", {GPU: 1})]
            ),
            {"gpu": 3},
        ),
        # per resource, independently
        (
            pod([container(limits={MIG: 2})], [container("init", {GPU: 1})]),
            {"gpu": 1, "mig-1g.5gb": 2},
        ),
        # requests only
        (pod([{"name": "a", "resources": {"requests": {GPU: "2"}}}]), {"gpu": 2}),
        # requests equal to limits, written differently
        (
            pod([{"name": "a", "resources": {"requests": {GPU: "2000m"}, "limits": {GPU: 2}}}]),
            {"gpu": 2},
        ),
        # zero is no demand; cpu/memory/other vendors are not ours
        (pod([container(limits={GPU: "0", "cpu": "1500m", "amd.com/gpu": "1"})]), {}),
        (pod([container()]), {}),
        (pod([container(limits={"nvidia.com/mig-1g.10gb+me": 1})]), {"mig-1g.10gb.me": 1}),
        (pod([container(limits={"nvidia.com/mig-3g.71gb": "1e0"})]), {"mig-3g.71gb": 1}),
        ({"spec": {"containers": None}}, {}),
        ({"spec": {"containers": [{"name": "a", "resources": None}]}}, {}),
    ],
)
def test_effective_demand(spec_pod: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_demand(PodView.parse(spec_pod)) == expected


def test_fixture_job_with_init_containers_and_sidecar() -> None:
    review = load_review("job_init_sidecar_create")
    # app 2 + sidecar 1 = 3 < convert-checkpoint 3 + sidecar 1 = 4
    assert pod_demand(PodView.parse(review["request"]["object"])) == {"gpu": 4}


def test_fixture_mig_pod() -> None:
    assert pod_demand(PodView.parse(load_review("mig_pytorchjob_create")["request"]["object"])) == {
        "mig-1g.5gb": 2
    }


@pytest.mark.parametrize(
    ("bad_pod", "message"),
    [
        (
            gpu_pod("1500m"),
            r"container 'main': nvidia.com/gpu is '1500m': GPUs and MIG devices are whole",
        ),
        (gpu_pod("0.5"), "whole devices"),
        (gpu_pod("-1"), "cannot be negative"),
        (gpu_pod(-2), "cannot be negative"),
        (gpu_pod("lots"), "not a Kubernetes quantity"),
        (gpu_pod(True), "not a quantity"),
        (gpu_pod(10**5000), r"out of range \(at most 1000000 devices\)"),
        (gpu_pod("1E"), r"out of range \(at most 1000000 devices\)"),
        (gpu_pod(-(10**5000)), r"out of range \(at most 1000000 devices\)"),
        (gpu_pod(1, resource="nvidia.com/mig-9g.99gb"), "unknown MIG profile '9g.99gb'"),
        (
            gpu_pod(1, resource="nvidia.com/gpu.shared"),
            "unknown NVIDIA resource 'nvidia.com/gpu.shared'",
        ),
        (
            pod([{"name": "t", "resources": {"limits": {GPU: "1"}, "requests": {GPU: "2"}}}]),
            r"container 't': nvidia.com/gpu requests \(2\) differ from limits \(1\)",
        ),
        (
            pod([container()], [{"name": "i", "resources": {"limits": {GPU: "1.5"}}}]),
            "init container 'i'",
        ),
    ],
)
def test_bad_demand_raises_demand_error(bad_pod: Any, message: str) -> None:
    with pytest.raises(DemandError, match=message):
        pod_demand(PodView.parse(bad_pod))


# --- property: pod_demand equals a phase-by-phase reference of the rule ---------------

RESOURCES = {GPU: "gpu", MIG: "mig-1g.5gb", "nvidia.com/mig-3g.40gb": "mig-3g.40gb"}


def spellings(n: int) -> st.SearchStrategy[Any]:
    return st.sampled_from([n, str(n), f"{n * 1000}m", f"{n}e0", f"{n}.0"])


@st.composite
def gpu_container(draw: st.DrawFn, name: str) -> tuple[dict[str, Any], dict[str, int]]:
    counts = draw(
        st.dictionaries(st.sampled_from(sorted(RESOURCES)), st.integers(0, 8), max_size=3)
    )
    limits: dict[str, Any] = {"cpu": "1"}
    requests: dict[str, Any] = {}
    for key, n in counts.items():
        where = draw(st.sampled_from(["limits", "requests", "both"]))
        if where in ("limits", "both"):
            limits[key] = draw(spellings(n))
        if where in ("requests", "both"):
            requests[key] = draw(spellings(n))
    body = {"name": name, "image": "x", "resources": {"limits": limits, "requests": requests}}
    return body, {RESOURCES[k]: n for k, n in counts.items()}


@st.composite
def pods_with_expected(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, int]]:
    apps = [draw(gpu_container(f"app{i}")) for i in range(draw(st.integers(1, 3)))]
    inits = []
    for i in range(draw(st.integers(0, 4))):
        body, counts = draw(gpu_container(f"init{i}"))
        is_sidecar = draw(st.booleans())
        if is_sidecar:
            body["restartPolicy"] = "Always"
        inits.append((body, counts, is_sidecar))
    spec = {"containers": [b for b, _ in apps], "initContainers": [b for b, _, _ in inits]}
    # Reference: the demand of every phase of the pod's life, then the maximum.
    phases: list[dict[str, int]] = []
    started: list[dict[str, int]] = []
    for _, counts, is_sidecar in inits:
        if is_sidecar:
            started.append(counts)
        else:
            phases.append(total([*started, counts]))
    phases.append(total([*started, *(c for _, c in apps)]))
    peak = {r: max(p.get(r, 0) for p in phases) for r in RESOURCES.values()}
    return {"spec": spec}, {r: n for r, n in peak.items() if n}


def total(parts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for r, n in part.items():
            out[r] = out.get(r, 0) + n
    return out


@settings(max_examples=200)
@given(pods_with_expected())
def test_pod_demand_matches_phase_reference(case: tuple[dict[str, Any], dict[str, int]]) -> None:
    spec_pod, expected = case
    assert pod_demand(PodView.parse(spec_pod)) == expected


@settings(max_examples=200)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "spec",
                        "containers",
                        "initContainers",
                        "resources",
                        "limits",
                        "requests",
                        GPU,
                        "name",
                        "restartPolicy",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_arbitrary_json_gives_counts_or_demand_error(value: Any) -> None:
    try:
        pod = PodView.parse(value)
    except PodError as exc:  # not shaped like a Pod: refused before any demand is read
        assert type(exc) is PodError
        return
    try:
        result = pod_demand(pod)
    except DemandError:
        return
    assert all(isinstance(n, int) and n > 0 for n in result.values())


PROFILE = "fairgate.io/mig-profile"


def test_mig_profile_label_accounts_gpus_as_that_profiles_devices() -> None:
    assert pod_demand(PodView.parse(gpu_pod(3, labels={PROFILE: "1g.5gb"}))) == {"mig-1g.5gb": 3}
    assert pod_demand(PodView.parse(gpu_pod(3))) == {"gpu": 3}


@pytest.mark.parametrize(
    ("pod", "fragment"),
    [
        (gpu_pod(1, labels={PROFILE: "1g.5gb"}, resource="nvidia.com/mig-1g.5gb"),
         "request nvidia.com/gpu only"),
        (gpu_pod(0, labels={PROFILE: "1g.5gb"}), "asks for no nvidia.com/gpu"),
        (gpu_pod(1, labels={PROFILE: "5g.1gb"}), "not a MIG profile fairgate knows"),
    ],
)
def test_mig_profile_label_misuse_is_a_demand_error(pod: Any, fragment: str) -> None:
    with pytest.raises(DemandError, match=PROFILE) as info:
        pod_demand(PodView.parse(pod))
    assert fragment in str(info.value)

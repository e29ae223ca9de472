"""GPU resource names and slice arithmetic.

Contract:
- A *resource* is fairgate's short name for an NVIDIA extended resource: ``gpu`` for
  ``nvidia.com/gpu`` and ``mig-<profile>`` for ``nvidia.com/mig-<profile>`` (MIG ``mixed``
  strategy). Media-extension profiles (``1g.10gb+me`` in nvidia-smi) are spelled
  ``mig-1g.10gb.me`` because ``+`` is not allowed in Kubernetes resource names; the
  ``+me`` spelling is accepted in quota files and normalised.
- Accounting is in integer compute *slices*: a whole GPU is 7 slices, a MIG profile
  ``Ng.*`` is N slices. GPU-equivalents = slices / 7, shown with two decimals.
- A ``ResourceCounts`` maps resource names to non-negative integer counts.
- A *capacity key* names a resource in one placement class (:mod:`tenants.placement`):
  the resource, then ``#<MIG strategy>`` unless the resource's usual one (``gpu`` on
  nodes without MIG, ``mig-*`` on ``mixed`` nodes), then ``@<node pool>`` for pool nodes:
  ``gpu``, ``gpu@a``, ``gpu#mixed``, ``mig-1g.5gb#single@a``. :func:`base_of` gives the
  resource; slices count by it (:func:`slices_of` accepts capacity keys).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SLICES_PER_GPU = 7
GPU = "gpu"
NVIDIA_PREFIX = "nvidia.com/"
MIG_PREFIX = "mig-"

ResourceCounts = dict[str, int]

# MIG profiles of the GPUs fairgate knows, as exposed by the NVIDIA device plugin
# under the mixed strategy (nvidia.com/mig-<profile>).
_MIG_PROFILES_BY_GPU: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("1g.5gb", "1g.5gb.me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-94GB": ("1g.12gb", "1g.12gb.me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H100-96GB": ("1g.12gb", "1g.12gb.me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    "H200-141GB": (
        "1g.18gb", "1g.18gb.me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ),
}
MIG_PROFILES: frozenset[str] = frozenset(
    profile for profiles in _MIG_PROFILES_BY_GPU.values() for profile in profiles
)
KNOWN_RESOURCES: frozenset[str] = frozenset({GPU} | {MIG_PREFIX + p for p in MIG_PROFILES})



def mig_profiles_of(gpu: str) -> tuple[str, ...]:
    """The MIG profiles of a GPU family fairgate knows (``A100-40GB``, ``H100-80GB``...)."""
    return _MIG_PROFILES_BY_GPU[gpu]


_PROFILE_SLICES = re.compile(r"^(\d+)g\.")
STRATEGY_SEP = "#"
POOL_SEP = "@"
_BASE = re.compile(r"^[^#@]*")


class UnknownResourceError(ValueError):
    """A resource name that fairgate does not know."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"unknown GPU resource {name!r}: use 'gpu' or a MIG profile such as "
            f"'mig-1g.5gb', 'mig-3g.40gb', 'mig-1g.18gb' (A100, H100, H200 profiles; "
            f"'+me' media-extension profiles are written '.me')"
        )


def normalise(name: str) -> str:
    """Return the canonical short name for a resource (``+me`` becomes ``.me``)."""
    return name.replace("+me", ".me")


def is_known(name: str) -> bool:
    """Whether ``name`` (short form) is a resource fairgate accounts for."""
    return normalise(name) in KNOWN_RESOURCES


def base_of(key: str) -> str:
    """The resource of a capacity key (``mig-1g.5gb#single@a`` -> ``mig-1g.5gb``); a
    plain resource name is its own base."""
    match = _BASE.match(key)
    assert match is not None  # the pattern matches every string
    return match.group(0)


def slices_of(name: str) -> int:
    """Compute slices held by one unit of resource (or capacity key) ``name``; raises
    UnknownResourceError."""
    canonical = normalise(base_of(name))
    if canonical not in KNOWN_RESOURCES:
        raise UnknownResourceError(name)
    if canonical == GPU:
        return SLICES_PER_GPU
    match = _PROFILE_SLICES.match(canonical[len(MIG_PREFIX) :])
    assert match is not None  # every known profile starts with <N>g.
    return int(match.group(1))


def short_name(k8s_name: str) -> str | None:
    """Map a Kubernetes resource name to its short name, or None if not an NVIDIA resource.

    ``nvidia.com/gpu`` -> ``gpu``; ``nvidia.com/mig-1g.5gb`` -> ``mig-1g.5gb``. The result
    may still be unknown (``nvidia.com/mig-9g.1gb``): check it with :func:`is_known`.
    """
    if not k8s_name.startswith(NVIDIA_PREFIX):
        return None
    return normalise(k8s_name[len(NVIDIA_PREFIX) :])


def k8s_name(short: str) -> str:
    """The Kubernetes extended-resource name of a short resource name."""
    return NVIDIA_PREFIX + short


def total_slices(counts: Mapping[str, int]) -> int:
    """Sum of compute slices over ``counts``."""
    return sum(slices_of(name) * n for name, n in counts.items())


def gpu_equivalents(slices: int) -> str:
    """Slices as GPU-equivalents with two decimals, e.g. 7 -> '1.00', 3 -> '0.43'."""
    whole, rest = divmod(slices * 100, SLICES_PER_GPU)
    hundredths = whole + (1 if rest * 2 >= SLICES_PER_GPU else 0)
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def format_counts(counts: Mapping[str, int]) -> str:
    """Counts as the ``fairgate.io/demand`` annotation: ``gpu=2,mig-1g.5gb=1`` (sorted)."""
    return ",".join(f"{name}={n}" for name, n in sorted(counts.items()) if n)


def parse_counts(text: str) -> ResourceCounts:
    """Inverse of :func:`format_counts`; raises ValueError on malformed text."""
    counts: ResourceCounts = {}
    if not text.strip():
        return counts
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not value.isdigit():
            raise ValueError(f"malformed demand entry {part!r}: expected '<resource>=<count>'")
        slices_of(name)
        counts[normalise(name.strip())] = int(value)
    return counts

"""Parse and check ``platform.yaml`` and ``quota.yaml`` text.

Contract: every function here is pure (text in, model or :class:`ConfigError` out).
A :class:`ConfigError` names the source (file or ConfigMap), the field path, what is
wrong and how to fix it; YAML syntax errors carry the 1-based line and column.
Documents are bounded in size before any parsing (``quota.yaml``: :data:`MAX_QUOTA_BYTES`,
64 KiB, since tenant admins write it; others :data:`MAX_DOCUMENT_BYTES`); YAML aliases
(alias bombs), nesting deeper than :data:`MAX_NESTING` and, in ``quota.yaml``, more than
:data:`MAX_QUOTA_NODES` values are refused while composing, before the rest is read.
Parsing uses libyaml's C scanner and parser when PyYAML has it (about 5x faster than the
pure-Python one, which is the fallback); the guarded composer and the constructor are
PyYAML's Python code in both cases (libyaml's own composer recurses without a bound: a
64 KiB ``[[[[...`` crashes the process). Parsing still costs CPU (tens of ms for a hostile
quota, more for a large platform.yaml): the webhook runs it in a worker process under a
time budget (:mod:`webhook.checker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from tenants import resources
from tenants.models import PlatformConfig, QuotaSpec

try:
    from yaml._yaml import CParser

    HAVE_LIBYAML = True
except ImportError:  # PyYAML built without libyaml
    HAVE_LIBYAML = False

MAX_DOCUMENT_BYTES = 256 * 1024
MAX_QUOTA_BYTES = 64 * 1024
MAX_QUOTA_NODES = 1000
MAX_NESTING = 32

ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config document."""

    field: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.field}: {self.message}" if self.field else f"{where}{self.message}"


class ConfigError(ValueError):
    """A config document that cannot be used; ``problems`` says what and where."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(str(p) for p in problems))


class _GuardedComposer(Composer):
    """PyYAML's composer, refusing aliases, nesting deeper than MAX_NESTING and more
    than ``max_nodes`` nodes."""

    _depth = 0
    _nodes = 0
    max_nodes: int | None = None

    def compose_node(self, parent: Any, index: Any) -> Any:
        events: Any = self  # the parser part of the loader (Python or libyaml)
        event = events.peek_event()
        if events.check_event(yaml.AliasEvent):
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not allowed here; write the value out",
                event.start_mark,
            )
        if self._depth >= MAX_NESTING:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"nested deeper than {MAX_NESTING} levels; a fairgate config is a few levels deep",
                event.start_mark,
            )
        self._nodes += 1
        if self.max_nodes is not None and self._nodes > self.max_nodes:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"more than {self.max_nodes} YAML values; a fairgate config has a few dozen",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _PureLoader(_GuardedComposer, yaml.SafeLoader):
    """A safe loader in pure Python, with the guarded composer."""


_Loader: type[Any] = _PureLoader
if HAVE_LIBYAML:

    class _FastLoader(_GuardedComposer, CParser, SafeConstructor, Resolver):
        """libyaml's scanner and parser (C) under the guarded composer and the safe
        constructor: the composer's ``get_single_node`` comes first in the MRO, so
        libyaml's unbounded C composer is never used."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)

    _Loader = _FastLoader


def load_yaml_mapping(
    text: str, source: str, max_bytes: int = MAX_DOCUMENT_BYTES, max_nodes: int | None = None
) -> dict[str, Any]:
    """Parse ``text`` as one YAML mapping (empty text is ``{}``); refuse it unparsed when
    it is over ``max_bytes`` (UTF-8), and stop at the first node past ``max_nodes``."""
    size = len(text.encode("utf-8", "replace"))
    if size > max_bytes:
        raise ConfigError(source, [Problem(
            "", f"document is {size:,} bytes, over the {max_bytes:,}-byte "
                f"({max_bytes // 1024} KiB) cap: keep it to the keys fairgate reads",
        )])
    try:
        loader = _Loader(text)
        loader.max_nodes = max_nodes
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        what = exc.problem or exc.context or "invalid YAML"
        kind = "YAML not accepted" if isinstance(exc, yaml.constructor.ConstructorError) else (
            "YAML syntax error"
        )
        raise ConfigError(source, [Problem("", f"{kind}{column}: {what}", line)]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", f"YAML error: {exc}")]) from exc
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(source, [Problem("", f"unusable value: {exc}")]) from exc
    except RecursionError as exc:
        raise ConfigError(source, [Problem("", "document nested too deeply")]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            source, [Problem("", f"expected a mapping of keys, got {type(data).__name__}")]
        )
    return data


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _hint(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key: remove it or check its spelling"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be a whole number (e.g. 4)"
    if kind == "greater_than_equal":
        return "must be 0 or more"
    if kind == "greater_than":
        return f"must be greater than {error['ctx']['gt']}"
    if kind == "literal_error":
        return f"must be one of {error['ctx']['expected']}"
    message: str = error["msg"]
    return message.removeprefix("Value error, ")


def parse_model(model: type[ModelT], data: dict[str, Any], source: str) -> ModelT:
    """Validate ``data`` as ``model``, turning pydantic errors into a :class:`ConfigError`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [Problem(_field_path(e["loc"]), _hint(e)) for e in exc.errors()]
        raise ConfigError(source, problems) from exc


def parse_platform(text: str, source: str = "platform.yaml") -> PlatformConfig:
    """Parse ``platform.yaml`` text."""
    return parse_model(PlatformConfig, load_yaml_mapping(text, source), source)


def parse_quota(
    text: str, tenant: str, platform: PlatformConfig | None = None, source: str | None = None
) -> QuotaSpec:
    """Parse a tenant's ``quota.yaml`` (at most :data:`MAX_QUOTA_BYTES`) and check it
    against the platform's ceiling."""
    where = source or f"quota-{tenant}.yaml"
    document = load_yaml_mapping(text, where, MAX_QUOTA_BYTES, MAX_QUOTA_NODES)
    quota = parse_model(QuotaSpec, document, where)
    problems = quota_problems(quota, tenant, platform)
    if problems:
        raise ConfigError(where, problems)
    return quota


def quota_problems(
    quota: QuotaSpec, tenant: str, platform: PlatformConfig | None
) -> list[Problem]:
    """Cross-field rules: reserve within nominal; nominal, and nominal + borrowLimit, within
    the tenant's ceiling (the most its quota may ever grant)."""
    problems: list[Problem] = []
    nominal = quota.nominal_slices
    if quota.inference_reserve.slices > nominal:
        problems.append(
            Problem(
                "inferenceReserve.gpuEquivalents",
                f"{quota.inference_reserve.gpu_equivalents} is more than the nominal quota "
                f"({resources.gpu_equivalents(nominal)} GPU-eq): lower it or raise nominal",
            )
        )
    if platform is not None:
        spec = platform.tenants.get(tenant)
        if spec is None:
            problems.append(
                Problem(
                    "",
                    f"tenant {tenant!r} is not defined in fairgate-platform: ask the "
                    "platform team to add it under 'tenants'",
                )
            )
        elif nominal > spec.ceiling.slices:
            problems.append(
                Problem(
                    "nominal",
                    f"{resources.gpu_equivalents(nominal)} GPU-eq exceeds the ceiling of "
                    f"{spec.ceiling.gpu_equivalents} GPU-eq set by the platform team for "
                    f"{tenant!r}: lower nominal or ask them to raise the ceiling",
                )
            )
        elif nominal + quota.borrow_limit.slices > spec.ceiling.slices:
            problems.append(_borrow_problem(tenant, nominal, quota.borrow_limit.slices,
                                            spec.ceiling.slices))
    return problems


def _borrow_problem(tenant: str, nominal: int, borrow: int, ceiling: int) -> Problem:
    """nominal + borrowLimit over the ceiling: the numbers, and the largest borrowLimit
    (whole GPU-equivalents) that fits."""
    room = (ceiling - nominal) // resources.SLICES_PER_GPU * resources.SLICES_PER_GPU
    eq = resources.gpu_equivalents
    return Problem(
        "borrowLimit.gpuEquivalents",
        f"nominal {eq(nominal)} + borrowLimit {eq(borrow)} GPU-eq = {eq(nominal + borrow)} "
        f"exceeds {tenant}'s ceiling {eq(ceiling)}: lower borrowLimit to at most {eq(room)}",
    )

"""``fairgate config check DIR``: a config directory checked as ``fairgate serve`` reads it.

Contract: :func:`check_config_dir` reads ``directory`` with
:func:`tenants.localdir.scan_config_dir`, the reader ``serve``, ``dispatch`` and
``console`` use for ``--config-dir`` (no check of its own), and prints one line per config
file: ``ok`` with what it holds, or ``error`` followed by each problem (field, line when
known, what is wrong and how to fix it). Quotas and namespaces are checked against the
directory's ``platform.yaml``; when that one is broken, on their own (schema only), and
the output says so. Returns 0 when every file is valid (``serve`` would start on it), 1
otherwise (``serve`` would refuse to start; a running one keeps the last good version of
each broken file). Nothing is written and no Redis or cluster is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape

from tenants import resources
from tenants.localdir import NAMESPACES_FILE, PLATFORM_FILE, DirScan, scan_config_dir
from tenants.models import QUOTA_CONFIGMAP_PREFIX
from tenants.schema import ConfigError


def check_config_dir(directory: Path, out: TextIO) -> int:
    """Check ``directory`` and print the verdict on ``out`` (see the module contract)."""
    console = Console(file=out, highlight=False, soft_wrap=True)
    console.print(f"Checking {escape(str(directory))} as `fairgate serve --config-dir` "
                  "reads it:")
    try:
        scan = scan_config_dir(directory)
    except ConfigError as exc:
        _print_error(console, directory.name or str(directory), exc)
        console.print("[red]1 error[/red]: nothing was checked")
        return 1
    names = [PLATFORM_FILE, *sorted((scan.texts.keys() | scan.broken)
                                    - {PLATFORM_FILE, NAMESPACES_FILE}), NAMESPACES_FILE]
    errors = {Path(exc.source).name: exc for exc in scan.errors}
    for name in names:
        if name in errors:
            _print_error(console, name, errors[name])
        else:
            summary = _summary(scan, name, directory)
            console.print(f"  [green]ok[/green]    {escape(name)}: {escape(summary)}")
    if scan.platform is None:
        console.print(f"  (quotas and namespaces were checked without {PLATFORM_FILE}: its "
                      "tenants and ceilings are checked once it is valid)")
    if errors:
        files = "1 file has" if len(errors) == 1 else f"{len(errors)} files have"
        console.print(f"[red]{files} errors[/red]: fix them and run this again. `fairgate "
                      "serve` would not start on this directory; a running one keeps the "
                      "last good version of each broken file.")
        return 1
    console.print(f"[green]all {len(names)} files are valid[/green]")
    return 0


def _print_error(console: Console, name: str, error: ConfigError) -> None:
    console.print(f"  [red]error[/red] {escape(name)}:")
    for problem in error.problems:
        console.print(f"          {escape(str(problem))}")


def _summary(scan: DirScan, name: str, directory: Path) -> str:
    """What a valid file holds, in a few words."""
    if name == PLATFORM_FILE and scan.platform is not None:
        tenants = sorted(scan.platform.tenants)
        return f"{len(tenants)} tenant{'s' * (len(tenants) != 1)}: {', '.join(tenants) or '-'}"
    if name == NAMESPACES_FILE:
        count = len(scan.namespaces or {})
        return ("absent: no namespace is mapped to a tenant"
                if not (directory / name).is_file()
                else f"{count} namespace{'s' * (count != 1)} mapped")
    tenant = name.removesuffix(".yaml").removeprefix(QUOTA_CONFIGMAP_PREFIX)
    quota = scan.quotas[tenant]
    return (f"tenant {tenant}, nominal {resources.gpu_equivalents(quota.nominal_slices)} "
            f"GPU-eq, borrowLimit {resources.gpu_equivalents(quota.borrow_limit.slices)} GPU-eq")

"""The shape of the tables the commands print per tenant (``status``, ``simulate``,
``report``, ``demo``).

Contract: :func:`tenant_table` makes a rich table whose first ``names`` columns hold
names (tenant, class): left-aligned and never wrapped, so when the terminal is narrow
rich narrows the figures' columns (right-aligned, their headers wrapped between words)
and never cuts a name. Keep headers short and units in the caption, so that every table
fits 80 columns with its headers whole and 120 columns without a wrapped row.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table


def tenant_table(title: str, columns: Sequence[str], *, caption: str | None = None,
                 names: int = 1) -> Table:
    """A table titled ``title`` with ``columns``, the first ``names`` of them names."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for index, column in enumerate(columns):
        is_name = index < names
        table.add_column(column, justify="left" if is_name else "right", no_wrap=is_name)
    return table

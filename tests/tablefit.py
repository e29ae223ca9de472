"""Whether rich tables printed by a command fit a terminal: the checks the table tests share.

A table fits ``width`` columns when no line of it (border, header or row: the lines
that start with a box-drawing character; rich wraps titles and captions within them;
other lines are the command's own) is longer, nothing in them is cut (rich marks a cut
with ``…``) and every header word is printed whole (a word folded over two lines is cut
too). It fits *unwrapped* when, moreover, each header is one line and each row one
line: a row that wraps leaves its first cell blank on the lines it adds (the first
cells here are names, which must not wrap either).
"""

from __future__ import annotations

from collections.abc import Iterable

HEADER = "┃"
ROW = "│"
BOX = "┏┃┡│├└┌╭╰╞╘"


def problems(text: str, width: int, headers: Iterable[str], *, unwrapped: bool) -> list[str]:
    """What keeps the tables in ``text`` from fitting ``width`` (see the module contract);
    ``headers``: every column header the tables have. Empty when they fit."""
    lines = text.splitlines()
    table_lines = [line for line in lines if line and line[0] in BOX]
    found = [f"{len(line)} columns: {line!r}" for line in table_lines if len(line) > width]
    found += [f"cut: {line!r}" for line in table_lines if "…" in line]
    header_words = {word for line in lines if line.startswith(HEADER)
                    for word in line.replace(HEADER, " ").split()}
    found += [f"header word cut: {word!r} of {header!r}" for header in headers
              for word in header.split() if word not in header_words]
    if unwrapped:
        found += _wrapped(lines)
    return found


def _wrapped(lines: list[str]) -> list[str]:
    found = []
    header_lines = 0
    for line in [*lines, ""]:
        if line.startswith(HEADER):
            header_lines += 1
            continue
        if header_lines > 1:
            found.append(f"a header takes {header_lines} lines")
        header_lines = 0
        if line.startswith(ROW) and not line[1:].split(ROW)[0].strip():
            found.append(f"a row wraps: {line!r}")
    return found

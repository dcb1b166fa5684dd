"""A griffe extension for the API reference: attnflow's docstrings write numpy-style sections
with prose after the colon ("x0 : (..., n, d) initial tokens"), where numpydoc expects a type,
and end a Parameters section with sentences ("Returns a Trajectory ...") that numpydoc would
take for one more parameter. The entries become "name" plus an indented description (the types
then come from the signature's annotations), and such closing sentences move above the
section, into the description."""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADERS = ("Parameters", "Attributes", "Other Parameters")
_ENTRY = re.compile(r"^(?P<indent>\s*)(?P<names>[\w*]+(?:, [\w*]+)*) : (?P<text>.+)$")


def _is_header(lines: list[str], i: int) -> bool:
    return i + 1 < len(lines) and bool(lines[i].strip()) and set(lines[i + 1].strip()) == {"-"}


def rewrite(docstring: str) -> str:
    """The docstring with its parameter-like sections in plain numpydoc form (see above)."""
    lines, out = docstring.splitlines(), []
    section, header_at, i = None, 0, 0
    while i < len(lines):
        line = lines[i]
        if _is_header(lines, i):
            section, header_at = line.strip(), len(out)
            out += [line, lines[i + 1]]
            i += 2
            continue
        match = _ENTRY.match(line)
        if section in _HEADERS and match:
            out += [f"{match['indent']}{match['names']}", f"{match['indent']}    {match['text']}"]
        elif (section in _HEADERS and line.strip() and not line[0].isspace()
              and not lines[i - 1].strip()):
            end = next((j for j in range(i, len(lines)) if _is_header(lines, j)), len(lines))
            block = lines[i:end]
            while block and not block[-1].strip():
                block.pop()
            out[header_at:header_at] = [*block, ""]
            section, i = None, end
            continue
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


class ProseParameters(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)

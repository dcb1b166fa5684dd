"""A griffe extension for the API reference: attnflow's docstrings write numpy-style sections
with prose after the colon ("x0 : (..., n, d) initial tokens"), where numpydoc expects a type.
Moving that text onto the description line keeps the whole sentence as the description; the
types then come from the signature's annotations."""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADERS = ("Parameters", "Attributes", "Other Parameters")
_ENTRY = re.compile(r"^(?P<indent>\s*)(?P<names>[\w*]+(?:, [\w*]+)*) : (?P<text>.+)$")


def rewrite(docstring: str) -> str:
    """The docstring with "name : text" entries of parameter-like sections split into
    "name" and an indented "text" line."""
    lines, out, section = docstring.splitlines(), [], None
    for i, line in enumerate(lines):
        underline = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        if underline:
            section = line.strip()
        match = _ENTRY.match(line)
        if section in _HEADERS and match and not underline:
            out += [f"{match['indent']}{match['names']}",
                    f"{match['indent']}    {match['text']}"]
        else:
            out.append(line)
    return "\n".join(out)


class ProseParameters(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)

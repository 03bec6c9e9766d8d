"""Patterns over cache entries, for invalidating many at once and for the command line.

A pattern is a glob over the entry (the part of a key between the braces: the template
with its fields rendered), in Redis's glob syntax (``*``, ``?``, ``[abc]``, ``[^a]``,
``\\`` to escape). It may also be a template: ``{field}`` placeholders take the rendered
value given for them, and match any one field's text where none is given. A rendered
field never holds ``:`` (it is escaped), so under ``"u:{a}:{b}"`` a missing field stands
for ``[^:]*``, which SCAN's glob cannot say: the glob (``EntryPattern.glob``) narrows the
scan on the server, and ``matches`` decides each entry exactly.

An entry longer than ``max_key_length`` was shortened to a prefix and a hash when its key
was built: a pattern naming it exactly finds it (``exact_key`` shortens the same way),
but a glob over its end does not.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidKey
from .keys import render, shorten

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_NOT_IN_AN_ENTRY = re.compile(r"[{}\x00-\x20\x7f]")


@dataclass(frozen=True)
class EntryPattern:
    glob: str  # over the entry, for SCAN MATCH
    regex: re.Pattern[str]  # the exact test of an entry
    exact: str | None = None  # the entry, when the pattern names one (no wildcard, every field given)

    def exact_key(self, namespace: str, max_key_length: int) -> str | None:
        """The value key of the one entry the pattern names, if it names one (shortened
        as a loader's key is when longer than ``max_key_length``)."""
        return None if self.exact is None else f"{namespace}:{{{shorten(self.exact, max_key_length)}}}"

    def scan_match(self, namespace: str) -> str:
        """The SCAN MATCH pattern of the keys of matching entries (values, leases, ...)."""
        return f"{namespace}:{{{self.glob}}}*"

    def matches(self, value_key: str) -> bool:
        """Whether the entry of ``value_key`` (``ns:{entry}``) matches."""
        start = value_key.find("{")
        return start >= 0 and value_key.endswith("}") and self.regex.fullmatch(value_key[start + 1 : -1]) is not None


def entry_pattern(pattern: str, fields: dict[str, Any] | None = None) -> EntryPattern:
    """The ``EntryPattern`` of a glob, or of a template and some of its fields' values.
    ``InvalidKey`` for a pattern no entry could match (braces outside placeholders,
    whitespace, an unclosed ``[``) or a field that is not in the template."""
    fields = dict(fields or {})
    if not isinstance(pattern, str) or not pattern:
        raise InvalidKey(f"a pattern must be a non-empty str, got {pattern!r}")
    try:
        parsed = list(string.Formatter().parse(pattern))
    except ValueError as error:
        raise InvalidKey(f"bad pattern {pattern!r}: {error}") from None
    glob, regex, entry = [], [], []
    exact = True
    for literal, field, spec, conversion in parsed:
        if _NOT_IN_AN_ENTRY.search(literal):
            raise InvalidKey(f"bad pattern {pattern!r}: no entry holds braces, whitespace or control characters")
        glob.append(literal)
        regex.append(_glob_regex(literal, pattern))
        entry.append(literal)
        exact = exact and _GLOB_SPECIAL.search(literal) is None
        if field is None:
            continue
        if not field or spec or conversion:
            raise InvalidKey(f"bad pattern {pattern!r}: a placeholder is a field's name, as {{id}}")
        if field in fields:
            text = render(fields.pop(field), name=f"field {field!r}")
            glob.append(_GLOB_SPECIAL.sub(r"\\\1", text))
            regex.append(re.escape(text))
            entry.append(text)
        else:
            glob.append("*")
            regex.append("[^:]*")
            exact = False
    if fields:
        raise InvalidKey(f"pattern {pattern!r} has no placeholder for {', '.join(sorted(fields))}")
    return EntryPattern("".join(glob), re.compile("".join(regex), re.DOTALL), "".join(entry) if exact else None)


def _glob_regex(glob: str, pattern: str) -> str:
    """Redis's glob syntax as a regular expression, read as Redis reads it
    (``stringmatchlen``): in a set, ``]`` right after ``[`` or ``[^`` closes it, a range
    may run backwards (``[z-a]`` is ``[a-z]``), and every other character, ``[`` and
    ``\\`` too, stands for itself. Each member is escaped on its own, so no set reaches
    ``re`` in a form it reads otherwise (or warns about)."""
    out, index = [], 0
    while index < len(glob):
        char = glob[index]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "\\" and index + 1 < len(glob):
            index += 1
            out.append(re.escape(glob[index]))
        elif char == "[":
            index, members, negated = _glob_set(glob, index + 1, pattern)
            if members:
                out.append("[" + ("^" if negated else "") + "".join(members) + "]")
            elif negated:
                out.append(".")  # [^]: any one character
            else:
                raise InvalidKey(f"bad pattern {pattern!r}: the empty set '[]' matches no entry")
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def _glob_set(glob: str, index: int, pattern: str) -> tuple[int, list[str], bool]:
    """The set that starts at ``glob[index]`` (just after its ``[``): the index of its
    closing ``]``, its members as regex set items, and whether it is negated."""
    negated = glob.startswith("^", index)
    index += negated
    members = []
    while True:
        if index >= len(glob):
            raise InvalidKey(f"bad pattern {pattern!r}: a '[' is never closed")
        char = glob[index]
        if char == "\\" and index + 1 < len(glob):
            index += 1
            members.append(re.escape(glob[index]))
        elif char == "]":
            return index, members, negated
        elif index + 2 < len(glob) and glob[index + 1] == "-":
            low, high = sorted((char, glob[index + 2]))
            members.append(f"{re.escape(low)}-{re.escape(high)}")
            index += 2
        else:
            members.append(re.escape(char))
        index += 1

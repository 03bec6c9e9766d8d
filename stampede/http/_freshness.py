"""How long a response stays fresh in a shared cache, and how old it already is (RFC 9111
section 4.2), with no I/O: ``Cache-Control`` directives, HTTP-dates, ``Age``.

* The freshness lifetime is ``s-maxage``, else ``max-age``, else ``Expires`` minus
  ``Date``. Only a response with none of these gets a lifetime of the cache's own (a
  status ttl, or a heuristic from ``Last-Modified``, section 4.2.2): an explicit expiry
  in the past keeps a response nowhere.
* A directive or a date that cannot be read makes the response stale (an ``Expires``
  that is no HTTP-date means "already expired", RFC 9111 section 5.3), never fresher.
* The age a response had when it arrived (``initial_age``) is the larger of what its
  ``Date`` says and what an upstream cache's ``Age`` says plus the time the request took
  (section 4.2.3): a response from a CDN or an inner cache is not kept past its life.
"""

from __future__ import annotations

import calendar
import email.utils
import re
import time
from collections.abc import Sequence

Headers = Sequence[tuple[str, str]]
"""Header fields as (lower-case name, value) pairs, in order."""

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTH = "|".join(_MONTHS)
_TIME = r"(\d\d):(\d\d):(\d\d)"
_IMF_FIXDATE = re.compile(rf"(?:{'|'.join(_DAYS)}), (\d\d) ({_MONTH}) (\d{{4}}) {_TIME} GMT")
_RFC850 = re.compile(rf"(?:{'|'.join(_LONG_DAYS)}), (\d\d)-({_MONTH})-(\d\d) {_TIME} GMT")
_ASCTIME = re.compile(rf"(?:{'|'.join(_DAYS)}) ({_MONTH}) ([ \d]\d) {_TIME} (\d{{4}})")


def http_date(value: str | None, now: float | None = None) -> float | None:
    """An HTTP-date (RFC 9110 section 5.6.7: IMF-fixdate, and the obsolete RFC 850 and
    asctime forms) as POSIX seconds; None if ``value`` is none of them. A two-digit year
    more than 50 years ahead of ``now`` is of the previous century."""
    if value is None:
        return None
    value = value.strip()
    if match := _IMF_FIXDATE.fullmatch(value):
        day, month, year, hour, minute, second = match.groups()
    elif match := _RFC850.fullmatch(value):
        day, month, short_year, hour, minute, second = match.groups()
        year = str(_full_year(int(short_year), now))
    elif match := _ASCTIME.fullmatch(value):
        month, day, hour, minute, second, year = match.groups()
    else:
        return None
    fields = (int(year), _MONTHS.index(month) + 1, int(day), int(hour), int(minute), int(second))
    if not (1 <= fields[2] <= 31 and fields[3] <= 23 and fields[4] <= 59 and fields[5] <= 60):
        return None
    return float(calendar.timegm((*fields, 0, 0, 0)))


def _full_year(year: int, now: float | None) -> int:
    this_year = time.gmtime(now).tm_year
    full = this_year - this_year % 100 + year
    return full - 100 if full > this_year + 50 else full


def format_http_date(seconds: float) -> str:
    """``seconds`` as an IMF-fixdate, the form a cache sends."""
    return email.utils.formatdate(seconds, usegmt=True)


def field_values(headers: Headers, name: str) -> list[str]:
    """Every field line of ``name``, in order."""
    return [value for key, value in headers if key == name]


def directives(value: str | None) -> dict[str, str | None]:
    """``Cache-Control`` as {directive: argument or None}, directives lower-case; the first
    of a directive given twice (RFC 9111 section 4.2.1). A quoted argument may hold commas."""
    found: dict[str, str | None] = {}
    if not value:
        return found
    for part in _split_list(value):
        name, equals, argument = part.partition("=")
        name = name.strip().lower()
        if name and name not in found:
            argument = argument.strip()
            if len(argument) >= 2 and argument[0] == argument[-1] == '"':
                argument = argument[1:-1]
            found[name] = argument if equals else None
    return found


def _split_list(value: str) -> list[str]:
    """A list field's members, split at commas outside quoted strings."""
    members: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            members.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    members.append("".join(current).strip())
    return [member for member in members if member]


def control(headers: Headers) -> dict[str, str | None]:
    """The response's (or request's) ``Cache-Control``, all its lines together."""
    return directives(", ".join(field_values(headers, "cache-control")))


def delta_seconds(argument: str | None) -> float | None:
    """A delta-seconds argument (digits only), or None if there is none or it is invalid."""
    if argument is None or not argument.isdigit():
        return None
    return float(min(int(argument), 2**31))


def explicit_lifetime(headers: Headers, cc: dict[str, str | None], response_time: float) -> float | None:
    """The freshness lifetime the response gives itself (``s-maxage``, ``max-age``,
    ``Expires`` minus ``Date``), 0 if what it gives cannot be read; None if it gives none."""
    for directive in ("s-maxage", "max-age"):
        if directive in cc:
            seconds = delta_seconds(cc[directive])
            return 0.0 if seconds is None else seconds
    expires = field_values(headers, "expires")
    if not expires:
        return None
    if len(expires) > 1:
        return 0.0  # two lines: invalid, so already expired
    expiry = http_date(expires[0], response_time)
    if expiry is None:
        return 0.0
    return max(0.0, expiry - date_of(headers, response_time))


def date_of(headers: Headers, response_time: float) -> float:
    """The response's ``Date``, or when it arrived if it has none that can be read."""
    dates = field_values(headers, "date")
    date = http_date(dates[0], response_time) if len(dates) == 1 else None
    return response_time if date is None else date


def age_of(headers: Headers) -> float | None:
    """The ``Age`` an upstream cache gave (0 if none), or None if it cannot be read: more
    than one field line, or a first member that is not a non-negative integer. RFC 9111
    section 5.1 lets a cache ignore such an ``Age``; a shared cache that cannot tell how
    old a response is takes it as stale instead, which never serves it past its life."""
    lines = field_values(headers, "age")
    if not lines:
        return 0.0
    first = lines[0].split(",", 1)[0].strip()
    if len(lines) > 1 or not first.isdigit():
        return None
    return float(min(int(first), 2**31))


def initial_age(headers: Headers, request_time: float, response_time: float) -> float | None:
    """How old the response was when it arrived (``corrected_initial_age``): the larger
    of what its ``Date`` says and its ``Age`` plus the time the request took. Whole
    seconds, as HTTP counts them: a ``Date`` of this second makes no age. None if its
    ``Age`` cannot be read (``age_of``)."""
    upstream = age_of(headers)
    if upstream is None:
        return None
    apparent = max(0.0, float(int(response_time)) - date_of(headers, response_time))
    corrected = upstream + max(0.0, response_time - request_time)
    return max(apparent, corrected)


def heuristic_lifetime(headers: Headers, fraction: float, response_time: float) -> float | None:
    """``fraction`` of the time since ``Last-Modified`` (RFC 9111 section 4.2.2), or None."""
    if fraction <= 0:
        return None
    modified = http_date(next(iter(field_values(headers, "last-modified")), None), response_time)
    if modified is None:
        return None
    return max(0.0, (date_of(headers, response_time) - modified) * fraction)

"""Secrets kept out of what stampede says: a URL's password never reaches a message, a log
record or an exception, since those end up in terminals, log stores and bug reports."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

HIDDEN = "***"

# user:password@ in an authority, and password=... (or sentinel_password=...) in a query
_AUTHORITY_PASSWORD = re.compile(r"(//[^/?#@:]*:)[^/?#@]*@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:sentinel_)?password=)[^&#]*")


def redacted(url: str) -> str:
    """``url`` with its passwords shown as ``***``: the one in its authority and any
    ``password=`` query field, as redis-py and libpq read them."""
    return _QUERY_PASSWORD.sub(rf"\g<1>{HIDDEN}", _AUTHORITY_PASSWORD.sub(rf"\g<1>{HIDDEN}@", url))


def secrets_of(url: str) -> list[str]:
    """The passwords in ``url``, as written and decoded (to find them in other text)."""
    found = [match.group(0)[match.group(0).index(":") + 1 : -1] for match in _AUTHORITY_PASSWORD.finditer(url)]
    found += [match.group(0).partition("=")[2] for match in _QUERY_PASSWORD.finditer(url)]
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        found.append(password)
    return sorted({form for secret in found if secret for form in (secret, unquote(secret))}, key=len, reverse=True)


def scrubbed(text: str, url: str) -> str:
    """``text`` (an error's message, say) with every password of ``url`` in it hidden."""
    text = text.replace(url, redacted(url))
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN)
    return text

"""Patterns over entries (``_core.patterns``), without a server: what a glob and a template
match, what the SCAN glob narrows to, and the patterns refused."""

from __future__ import annotations

import pytest

from stampede import InvalidKey
from stampede._core.keys import KeyBuilder
from stampede._core.patterns import entry_pattern


def key(entry: str) -> str:
    return "ns:{" + entry + "}"


def test_a_glob_matches_as_redis_would() -> None:
    pattern = entry_pattern("product:[0-4]?*")
    assert pattern.scan_match("ns") == "ns:{product:[0-4]?*}*"
    assert pattern.matches(key("product:12")) and pattern.matches(key("product:0x"))
    assert not pattern.matches(key("product:5x")) and not pattern.matches(key("product:1"))
    assert entry_pattern("a[^b]c").matches(key("axc")) and not entry_pattern("a[^b]c").matches(key("abc"))
    assert entry_pattern(r"a\*").matches(key("a*")) and not entry_pattern(r"a\*").matches(key("ab"))
    assert pattern.exact is None


def test_a_template_field_left_out_matches_one_field_only() -> None:
    pattern = entry_pattern("order:{shop}:{id}", {"shop": "s1"})
    assert pattern.glob == "order:s1:*"
    assert pattern.matches(key("order:s1:7")) and pattern.matches(key("order:s1:"))
    assert not pattern.matches(key("order:s1:7:x")) and not pattern.matches(key("order:s2:7"))


def test_a_template_with_every_field_names_the_key_the_loader_builds() -> None:
    def load(shop: str, ids: list[int]) -> None: ...

    builder = KeyBuilder(load, "order:{shop}:{ids}", "ns", 200)
    pattern = entry_pattern("order:{shop}:{ids}", {"shop": "a:b*", "ids": [1, 2]})
    assert pattern.exact_key("ns", 200) == builder.value_key(("a:b*", [1, 2]), {})
    assert pattern.matches(builder.value_key(("a:b*", [1, 2]), {}))
    assert "\\*" in pattern.glob and "\\[" in pattern.glob  # glob characters of a value are literal in SCAN
    assert entry_pattern("order:{id}", {"id": 5}).exact == entry_pattern("order:{id}", {"id": "5"}).exact == "order:5"


def test_a_long_entry_is_named_by_the_key_its_loader_shortened() -> None:
    def load(name: str) -> None: ...

    builder = KeyBuilder(load, "doc:{name}", "ns", 64)
    name = "x" * 100
    assert entry_pattern("doc:{name}", {"name": name}).exact_key("ns", 64) == builder.value_key((name,), {})
    assert "#" in builder.value_key((name,), {})


@pytest.mark.parametrize(
    ("pattern", "fields", "says"),
    [
        ("a[bc", {}, "never closed"),
        ("a b", {}, "whitespace"),
        ("a}b", {}, "malformed|braces|Single"),
        ("order:{}", {}, "placeholder"),
        ("order:{id!r}", {}, "placeholder"),
        ("order:{id}", {"shop": "s1"}, "no placeholder for shop"),
        ("order:{id}", {"id": float("nan")}, "finite"),
        ("", {}, "non-empty"),
    ],
)
def test_patterns_no_entry_could_match_are_refused(pattern: str, fields: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidKey, match=says):
        entry_pattern(pattern, fields)

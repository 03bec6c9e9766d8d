"""A layer's invalidations of many entries: by pattern (``invalidate_matching``) and by
tag (``invalidate_tag``, ``expire_tag``), and every version of a versioned entry.

One entry at a time is a loader's (``invalidate()``). This room finds the entries and
drops each as that does, then tells every caller in this process to read afresh
(``LayerParts.forget``). What a tag invalidation orders in the store is
``_core.tags``'s timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._core.keys import EntryKeys
from ._core.patterns import entry_pattern
from ._core.tags import TagKeys, clock_key, tag_name
from ._core.versions import entry_tag_of, versions_seen
from ._parts import LayerParts


class Invalidation:
    """``Stampede``'s invalidations of many entries (the facade documents each)."""

    def __init__(self, parts: LayerParts) -> None:
        self._parts = parts

    def matching(self, pattern: str, fields: dict[str, Any]) -> list[str]:
        parts = self._parts
        match = entry_pattern(pattern, fields)
        store = parts.blocking_store("matching", "amatching")
        return sorted(key for key in store.scan(parts.namespace, match.glob) if match.matches(key))

    async def amatching(self, pattern: str, fields: dict[str, Any]) -> list[str]:
        parts = self._parts
        match = entry_pattern(pattern, fields)
        store = parts.loop_store("amatching", "matching")
        return sorted(key for key in await store.scan(parts.namespace, match.glob) if match.matches(key))

    def invalidate_matching(
        self, pattern: str, fields: dict[str, Any], on_progress: Callable[[int, int], object] | None
    ) -> int:
        parts = self._parts
        # Each as invalidate() does it: by the layer's lease policy (Redlock's majority first).
        invalidate = parts.blocking_runner("invalidate_matching", "ainvalidate_matching").invalidate
        exact = entry_pattern(pattern, fields).exact_key(parts.namespace, parts.settings.max_key_length)
        keys = [exact] if exact is not None else self.matching(pattern, fields)
        tell = _every_tenth(on_progress, len(keys))
        for done, value_key in enumerate(keys, 1):
            try:
                with versions_seen() as seen:
                    invalidate(EntryKeys.for_value(value_key))
                for marked in seen:  # an entry a versioned loader marked: every version (``_core.versions``)
                    self.drop_versions(entry_tag_of(marked, parts.namespace), False)
            finally:
                parts.forget(value_key)
            tell(done)
        return len(keys)

    async def ainvalidate_matching(
        self, pattern: str, fields: dict[str, Any], on_progress: Callable[[int, int], object] | None
    ) -> int:
        parts = self._parts
        invalidate = parts.loop_runner("ainvalidate_matching", "invalidate_matching").invalidate
        exact = entry_pattern(pattern, fields).exact_key(parts.namespace, parts.settings.max_key_length)
        keys = [exact] if exact is not None else await self.amatching(pattern, fields)
        tell = _every_tenth(on_progress, len(keys))
        for done, value_key in enumerate(keys, 1):
            try:
                with versions_seen() as seen:
                    await invalidate(EntryKeys.for_value(value_key))
                for marked in seen:
                    await self.adrop_versions(entry_tag_of(marked, parts.namespace), False)
            finally:
                parts.forget(value_key)
            tell(done)
        return len(keys)

    def invalidate_tag(self, tag: str, fields: dict[str, Any], soft: bool, method: str, twin: str) -> int:
        """Invalidate (``soft``: expire) the entries of ``tag``. ``method`` and ``twin``
        name the facade's methods, for a layer without a blocking store."""
        keys = self._tag(tag, fields)
        store = self._parts.blocking_store(method, twin)
        return self._tag_done(store.invalidate_tag(clock_key(self._parts.namespace), keys, soft))

    async def ainvalidate_tag(self, tag: str, fields: dict[str, Any], soft: bool, method: str, twin: str) -> int:
        keys = self._tag(tag, fields)
        store = self._parts.loop_store(method, twin)
        return self._tag_done(await store.invalidate_tag(clock_key(self._parts.namespace), keys, soft))

    def drop_versions(self, name: str, soft: bool) -> int:
        """Invalidate (or expire) the entry tag ``name`` every versioned entry of an entry
        carries (``_core.versions``): its entries, in every version, and its loads in flight."""
        namespace = self._parts.namespace
        store = self._parts.blocking_store("invalidate", "ainvalidate")
        return self._tag_done(store.invalidate_tag(clock_key(namespace), TagKeys.of(namespace, name), soft))

    async def adrop_versions(self, name: str, soft: bool) -> int:
        """``drop_versions`` with this event loop's client."""
        namespace = self._parts.namespace
        store = self._parts.loop_store("ainvalidate", "invalidate")
        return self._tag_done(await store.invalidate_tag(clock_key(namespace), TagKeys.of(namespace, name), soft))

    def _tag(self, tag: str, fields: dict[str, Any]) -> TagKeys:
        """The keys of the tag named (``InvalidKey`` before any I/O for a tag no loader
        could render)."""
        parts = self._parts
        return TagKeys.of(parts.namespace, tag_name(tag, fields, parts.settings.max_key_length))

    def _tag_done(self, value_keys: list[str]) -> int:
        """After a tag invalidation: callers in this process read its entries afresh."""
        parts = self._parts
        for value_key in value_keys:
            parts.forget(value_key)
        parts.events.incr("tag_invalidations")
        if value_keys:
            parts.events.incr("tag_entries_dropped", len(value_keys))
        return len(value_keys)


def _every_tenth(on_progress: Callable[[int, int], object] | None, total: int) -> Callable[[int], None]:
    """``tell(done)``, passing ``(done, total)`` on to ``on_progress`` after each tenth of
    ``total`` and at the end."""
    step = max(1, total // 10)

    def tell(done: int) -> None:
        if on_progress is not None and (done % step == 0 or done == total):
            on_progress(done, total)

    return tell

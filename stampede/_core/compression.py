"""Compressed payloads (``compress_above``): zlib from the standard library, zstd through
the ``zstd`` extra (the ``zstandard`` package, or the standard library's from Python 3.14).

An envelope says how its payload is compressed in its kind byte (``_core.codec``), so a
reader that does not know the kind (an older stampede, or one without zstd) finds no
value it can read and treats the entry as a miss. Decompression is bounded: a payload
that would expand past the reader's ``max_value_bytes`` is refused, so bytes somebody
else wrote to the cache server cannot make a reader allocate without limit.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

from .._errors import ConfigError

ZLIB_KIND, ZSTD_KIND = 3, 4
"""The envelope kinds of a value whose payload is compressed (1 is a plain value)."""

ZLIB_LEVEL = 6  # zlib's own default
ZSTD_LEVEL = 3  # zstd's own default
_CHUNK = 65536


class Compressor(Protocol):
    name: str
    kind: int

    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes, limit: int) -> bytes:
        """``data`` expanded, or ``ValueError`` if it is not this compressor's or would
        expand past ``limit`` bytes."""
        ...


class Zlib:
    name, kind = "zlib", ZLIB_KIND

    def compress(self, data: bytes) -> bytes:
        return zlib.compress(data, ZLIB_LEVEL)

    def decompress(self, data: bytes, limit: int) -> bytes:
        expander = zlib.decompressobj()
        try:
            out = expander.decompress(data, limit + 1)
        except zlib.error as error:
            raise ValueError(f"not zlib data ({error})") from None
        if len(out) > limit:
            raise ValueError(f"it expands past max_value_bytes={limit}")
        if not expander.eof:
            raise ValueError("truncated zlib data")
        return out


class Zstd:
    name, kind = "zstd", ZSTD_KIND

    def __init__(self, module: Any, stdlib: bool) -> None:
        self._module = module
        self._stdlib = stdlib

    def compress(self, data: bytes) -> bytes:
        if self._stdlib:
            return self._module.compress(data, ZSTD_LEVEL)  # type: ignore[no-any-return]
        return self._module.ZstdCompressor(level=ZSTD_LEVEL).compress(data)  # type: ignore[no-any-return]

    def decompress(self, data: bytes, limit: int) -> bytes:
        try:
            if self._stdlib:
                expander = self._module.ZstdDecompressor()
                out: bytes = expander.decompress(data, max_length=limit + 1)
                complete = expander.eof
            else:
                parts, size = [], 0
                with self._module.ZstdDecompressor().stream_reader(data) as reader:
                    while size <= limit and (part := reader.read(_CHUNK)):
                        parts.append(part)
                        size += len(part)
                out, complete = b"".join(parts), True
        except Exception as error:
            raise ValueError(f"not zstd data ({error})") from None
        if len(out) > limit:
            raise ValueError(f"it expands past max_value_bytes={limit}")
        if not complete:
            raise ValueError("truncated zstd data")
        return out


ZLIB = Zlib()


def _zstd() -> Zstd | None:
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python 3.14+

        return Zstd(zstd, stdlib=True)
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return Zstd(zstandard, stdlib=False)


ZSTD = _zstd()

BY_KIND: dict[int, Compressor] = {ZLIB_KIND: ZLIB, **({ZSTD_KIND: ZSTD} if ZSTD is not None else {})}
"""The compressors this process can read."""


def compressor(name: str) -> Compressor:
    """The compressor ``compression=name`` asks for, or ``ConfigError`` saying what to install."""
    if name == "zlib":
        return ZLIB
    if name == "zstd":
        if ZSTD is None:
            raise ConfigError("compression='zstd' needs the zstd extra: pip install 'stampede-guard[zstd]'")
        return ZSTD
    raise ConfigError(f'compression must be "zlib" or "zstd", got {name!r}')

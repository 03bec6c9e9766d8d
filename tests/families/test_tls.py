"""TLS (``rediss://``): every connection the layer opens (commands, scripts, the
subscriber; blocking and asyncio) speaks TLS and checks the server's certificate.

The embedded server is built without TLS, so the suite puts a TLS terminator in front of
a real server: an asyncio server on 127.0.0.1 with a certificate from a test CA
(trustme), relaying the decrypted bytes. The client side is redis-py's own TLS code."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, Stampede

from ..scenarios import one_load_and_a_wake_up

trustme = pytest.importorskip("trustme")


class TlsTerminator:
    """TLS on 127.0.0.1 in front of a plain server, in one event loop in a thread."""

    def __init__(self, target_port: int, context: ssl.SSLContext) -> None:
        self.target_port = target_port
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(context, started), daemon=True)
        self.thread.start()
        assert started.wait(5)

    def _run(self, context: ssl.SSLContext, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context))
        self.port = self.server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.writers.add(client_writer)
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers.add(server_writer)

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (OSError, ssl.SSLError):
                pass
            writer.close()

        await asyncio.gather(pump(client_reader, server_writer), pump(server_reader, client_writer))

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            relays = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
            # Cancelled relays leave their streams open: close them while the loop runs.
            for writer in self.writers:
                writer.transport.abort()
            await asyncio.sleep(0.01)  # the transports' connection_lost callbacks run

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def tls(redis_url: str, tmp_path: Path) -> Iterator[tuple[TlsTerminator, Path]]:
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    terminator = TlsTerminator(redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"], context)
    yield terminator, ca_file
    terminator.close()


def rediss(terminator: TlsTerminator, ca_file: Path) -> str:
    return f"rediss://127.0.0.1:{terminator.port}/0?ssl_ca_certs={ca_file}&ssl_cert_reqs=required"


def test_blocking_callers_over_tls_load_once_and_are_woken(
    tls: tuple[TlsTerminator, Path], make_layer: Callable[..., Stampede]
) -> None:
    url = rediss(*tls)
    first, second = (make_layer(url, namespace="tls", lock_ttl=20, recheck_interval=20) for _ in range(2))
    loads, lag = one_load_and_a_wake_up(first, second)
    assert loads == 1
    assert lag < 1.0  # by the message over TLS, not the 20 s re-check


def test_async_callers_over_tls(tls: tuple[TlsTerminator, Path], make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(rediss(*tls), namespace="tls-async")
    calls: list[int] = []

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        calls.append(key)
        await asyncio.sleep(0.05)
        return {"key": key}

    async def main() -> list[Any]:
        results = await asyncio.gather(*(load(1) for _ in range(50)))
        await layer.aclose()
        return results

    assert asyncio.run(main()) == [{"key": 1}] * 50 and calls == [1]


def test_a_certificate_from_another_authority_is_refused(
    tls: tuple[TlsTerminator, Path], tmp_path: Path, make_layer: Callable[..., Stampede]
) -> None:
    terminator, _ = tls
    stranger = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    layer = make_layer(rediss(terminator, stranger), namespace="tls", on_backend_error="raise")
    with pytest.raises(BackendUnavailable, match="(?i)certificate"):
        layer.cached_loader("item:{key}")(lambda key: key)(1)

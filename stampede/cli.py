"""The command line: ``python -m stampede`` (or the ``stampede`` console script).

    stampede [--url URL] [--namespace NS] [--json] COMMAND

    inspect PATTERN [FIELD=VALUE ...]     one entry (or each matching one): the value's
                                          kind, age, load duration, TTL left, size, tags.
                                          Its lease's holder and TTL. Processes waiting
    invalidate PATTERN [FIELD=VALUE ...]  one entry. Or, for a pattern, count the matching
                  [--yes]                 entries, and invalidate them with --yes
    invalidate --tag TAG [FIELD=VALUE ...] [--yes]
                                          count the entries that carry TAG, and with
                                          --yes invalidate them (``invalidate_tag``)
    locks                                 leases held: named locks (holder, TTL, fence,
                                          queue) and loads in flight
    stats [--metrics-url URL]             a running app's counters, from its metrics
    demo [...]                            the demo (``stampede demo --help``)

A PATTERN is a glob over the entry (``category-map:*``) or a template whose fields take
the values given (``category-map:{shop} shop=s1``, ``FIELD:=JSON`` for a value of another
type, ``ids:=[1,2]``) and match anything where none is given. See ``_core.patterns``.
Entries are found with SCAN on Redis (never KEYS) and by an index on PostgreSQL: the
command line asks the layer's backend what it holds (``_core.backend.Inspector``).
``--url`` takes what ``Stampede.from_url`` takes (add ``--cluster`` for a Redis
Cluster). Its default is $STAMPEDE_URL (or $STAMPEDE_REDIS_URL, its older name: the
default layer reads the same two), else redis://127.0.0.1:6379/0. PostgreSQL cannot count
the processes waiting on an entry: the command says so.

Output is for people unless ``--json`` (one JSON document on stdout). Errors print one
line on stderr and exit non-zero: 1 when the server cannot be reached or fails, 2 for a
bad argument (a malformed URL, a bad pattern).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import redis

from . import Stampede, __version__
from ._core.codec import Codec, Kind, stale_window_of
from ._core.keys import EntryKeys
from ._core.observer import MEASURES
from ._core.patterns import entry_pattern
from ._core.tags import TagKeys, tag_name
from ._errors import BackendUnavailable, ConfigError, InvalidKey
from ._layer import default_url
from ._redact import redacted, scrubbed

DEFAULT_URL = "redis://127.0.0.1:6379/0"
TIMEOUT = 5.0  # seconds, per command
PREVIEW = 200  # characters of a value shown to a person


class Failed(Exception):
    """One line for stderr, and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# --- the commands --------------------------------------------------------------------


def inspect(session: Session, options: argparse.Namespace) -> Any:
    keys = session.keys_of(options.pattern, options.fields)
    entries = [session.describe(key) for key in keys[: options.limit]]
    return {"pattern": options.pattern, "matched": len(keys), "entries": entries}


def invalidate(session: Session, options: argparse.Namespace) -> Any:
    fields = parse_fields(options.fields)
    if options.tag:
        return invalidate_tag(session, options, fields)
    exact = session.exact_key(options.pattern, fields)
    if exact is not None:
        session.layer.invalidate_matching(options.pattern, **fields)  # that entry, no scan
        return {"pattern": options.pattern, "matched": 1, "invalidated": 1, "keys": [exact]}
    keys = session.layer.matching(options.pattern, **fields)
    if not options.yes:
        return {"pattern": options.pattern, "matched": len(keys), "invalidated": 0, "dry_run": True}
    started = time.monotonic()
    count = session.layer.invalidate_matching(options.pattern, on_progress=_progress(started), **fields)
    return {"pattern": options.pattern, "matched": count, "invalidated": count, "seconds": time.monotonic() - started}


def invalidate_tag(session: Session, options: argparse.Namespace, fields: dict[str, Any]) -> Any:
    """The entries tagged PATTERN: counted, and with --yes invalidated (see invalidate_tag)."""
    layer = session.layer
    name = tag_name(options.pattern, fields, layer.settings.max_key_length)
    tagged = session.inspector.tagged(TagKeys.of(session.namespace, name))
    if not options.yes:
        return {"tag": name, "matched": tagged, "invalidated": 0, "dry_run": True}
    started = time.monotonic()
    if tagged:  # one call, in batches inside the store: said before it starts, since it takes a while
        print(f"invalidating {tagged} entries tagged {name!r}...", file=sys.stderr, flush=True)
    count = layer.invalidate_tag(options.pattern, **fields)  # not the shortened name: it renders again
    return {"tag": name, "matched": count, "invalidated": count, "seconds": time.monotonic() - started}


def _progress(started: float) -> Callable[[int, int], None]:
    """Long work's progress, on stderr (stdout keeps the result, JSON or not)."""

    def told(done: int, found: int) -> None:
        seconds = time.monotonic() - started
        print(f"invalidated {done} of {found} ({seconds:.1f} s)", file=sys.stderr, flush=True)

    return told


def locks(session: Session, options: argparse.Namespace) -> Any:
    namespace = session.namespace
    found = []
    for lease in session.inspector.leases(namespace):
        entry = lease.lock_key[len(namespace) + 2 : -len("}:lock")]
        named = entry.startswith("~lock:")
        row: dict[str, Any] = {
            "kind": "named" if named else "load",
            "name": entry[len("~lock:") :] if named else entry,
            "holder": lease.holder,
            "ttl_s": lease.ttl_ms / 1000 if lease.ttl_ms >= 0 else None,
        }
        if named:
            row["fence"], row["queued"] = lease.fence, lease.queued
        found.append(row)
    return {"namespace": namespace, "locks": sorted(found, key=lambda row: (row["kind"], row["name"]))}


def stats(session: Session | None, options: argparse.Namespace) -> Any:
    url = options.metrics_url
    if url is None:
        raise Failed(
            "stats live in the memory of each app process: expose them with stampede.prometheus "
            "(PrometheusMetrics and prometheus-client's HTTP server) and pass --metrics-url URL",
            2,
        )
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise Failed(f"cannot read metrics from {redacted(url)}: {error}", 1) from None
    totals: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("stampede_") or "_created" in line.split(" ")[0]:
            continue
        name, labels, value = _sample(line)
        if labels.get("namespace") not in (None, options.namespace):
            continue
        if name.endswith("_total"):
            series = totals.setdefault("counters", {})
            key = name[len("stampede_") : -len("_total")]
        elif name.endswith(("_seconds_count", "_seconds_sum")):
            series = totals.setdefault(name.split("_seconds_")[0][len("stampede_") :], {})
            key = name.rsplit("_", 1)[1] + ("" if "outcome" not in labels else f"[{labels['outcome']}]")
        else:
            continue
        series[key] = series.get(key, 0.0) + value
    if not totals:
        raise Failed(f"{redacted(url)} serves no stampede metrics for namespace {options.namespace!r}", 1)
    return {"namespace": options.namespace, "metrics_url": redacted(url), **totals}


def _sample(line: str) -> tuple[str, dict[str, str], float]:
    """A line of the Prometheus text format: name, labels, value."""
    head, _, value = line.rpartition(" ")
    name, _, rest = head.partition("{")
    labels = {}
    for part in rest.rstrip("}").split(","):
        if "=" in part:
            label, _, text = part.partition("=")
            labels[label.strip()] = text.strip().strip('"')
    return name, labels, float(value)


# --- a connection to the server, and what it reads -------------------------------------


def _reach_postgres(url: str) -> None:
    """Connect once, before a pool is made: a pool retries a database it cannot reach
    until its timeout, logging each try, and then names only the timeout. One line that
    names the cause is the command line's promise."""
    import psycopg

    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)  # its retries: the one line below says it
    try:
        psycopg.connect(url, connect_timeout=max(2, int(TIMEOUT))).close()
    except psycopg.Error as error:
        cause = " ".join(str(error).split())
        raise Failed(f"{redacted(url)}: cannot connect to PostgreSQL: {cause}", 1) from None


class Session:
    """A layer over the store the URL names (for invalidations, as the app's own would do
    them), and what its backend lets the command line read."""

    def __init__(self, url: str, namespace: str, cluster: bool) -> None:
        self.url, self.namespace = url, namespace
        if url.startswith(("postgres://", "postgresql://")):
            _reach_postgres(url)
        try:
            self.layer = Stampede.from_url(
                url, namespace=namespace, cluster=cluster, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT,
                max_connections=4,
            )  # fmt: skip
        except ValueError as error:  # redis-py's word for a URL it cannot read
            raise Failed(f"bad URL {redacted(url)!r}: {error}", 2) from None
        inspector = self.layer.inspector
        if inspector is None:
            self.layer.close()
            raise Failed(f"{redacted(url)!r} is a store in one process's memory: nothing to read from here", 2)
        self.inspector = inspector

    def close(self) -> None:
        self.layer.close()

    def exact_key(self, pattern: str, fields: dict[str, Any]) -> str | None:
        """The key of the one entry ``pattern`` names, if it names one."""
        return entry_pattern(pattern, fields).exact_key(self.namespace, self.layer.settings.max_key_length)

    def keys_of(self, pattern: str, raw_fields: list[str]) -> list[str]:
        fields = parse_fields(raw_fields)
        exact = self.exact_key(pattern, fields)
        return [exact] if exact is not None else self.layer.matching(pattern, **fields)

    def describe(self, value_key: str) -> dict[str, Any]:
        """What the store holds for one entry."""
        state = self.inspector.describe(EntryKeys.for_value(value_key))
        entry: dict[str, Any] = {"key": value_key, "entry": value_key[len(self.namespace) + 2 : -1]}
        entry.update(_describe_value(state.raw, state.ttl_ms))
        entry["failing"] = state.failing
        entry["lock"] = (
            {"held": True, "holder": state.holder, "ttl_s": _seconds(state.lock_ttl_ms)}
            if state.holder is not None
            else {"held": False}
        )
        entry["waiting_processes"] = state.waiting  # None: the store cannot tell
        entry["tags"] = state.tags or []
        return entry


def _describe_value(raw: bytes | None, ttl_ms: int) -> dict[str, Any]:
    if raw is None:
        return {"state": "absent"}
    decoded = Codec().decode(raw)
    described: dict[str, Any] = {"state": decoded.kind.value, "size_bytes": len(raw)}
    if decoded.kind is Kind.CORRUPT:
        described["problem"] = decoded.problem
        return described
    stale_for = stale_window_of(raw)
    described["loaded_at"] = datetime.datetime.fromtimestamp(decoded.loaded_at, datetime.timezone.utc).isoformat()
    described["age_s"] = round(time.time() - decoded.loaded_at, 3)
    described["load_duration_s"] = round(decoded.load_duration, 6)
    if ttl_ms >= 0:
        described["ttl_s"] = round(ttl_ms / 1000 - stale_for, 3)  # negative: served stale now
        described["stale_window_s"] = stale_for
    else:
        described["ttl_s"] = None  # written without an expiry
    if decoded.kind is Kind.VALUE:
        described["value"] = decoded.value
    return described


def _seconds(ms: int) -> float | None:
    return ms / 1000 if ms >= 0 else None


def parse_fields(raw_fields: list[str]) -> dict[str, Any]:
    """``name=text`` (a str, an int's key is the same) or ``name:=json``."""
    fields: dict[str, Any] = {}
    for raw in raw_fields:
        name, sep, text = raw.partition("=")
        if not sep or not name:
            raise Failed(f"bad field {raw!r}: write name=value (a str) or name:=json", 2)
        if name.endswith(":"):
            try:
                fields[name[:-1]] = json.loads(text)
            except ValueError as error:
                raise Failed(f"bad field {raw!r}: {error}", 2) from None
        else:
            fields[name] = text
    return fields


# --- output ----------------------------------------------------------------------------


def _human(command: str, result: Any) -> str:
    if command == "inspect":
        if not result["entries"]:
            return f"no entry matches {result['pattern']!r}"
        shown = "\n\n".join(_human_entry(entry) for entry in result["entries"])
        more = result["matched"] - len(result["entries"])
        return shown + (f"\n\n... and {more} more (--limit)" if more > 0 else "")
    if command == "invalidate" and "tag" in result:
        if result.get("dry_run"):
            return (
                f"{result['matched']} entries carry the tag {result['tag']!r}; nothing invalidated "
                "(run again with --yes to invalidate them)"
            )
        return f"invalidated {result['invalidated']} entries tagged {result['tag']!r} in {result['seconds']:.2f} s"
    if command == "invalidate":
        if result.get("dry_run"):
            return (
                f"{result['matched']} entries match {result['pattern']!r}; nothing invalidated "
                "(run again with --yes to invalidate them)"
            )
        took = f" in {result['seconds']:.2f} s" if "seconds" in result else ""
        return f"invalidated {result['invalidated']} entries matching {result['pattern']!r}{took}"
    if command == "locks":
        if not result["locks"]:
            return f"no lease held in namespace {result['namespace']!r}"
        rows = [("kind", "name", "holder", "ttl s", "fence", "queued")]
        for lock in result["locks"]:
            ttl = "-" if lock["ttl_s"] is None else f"{lock['ttl_s']:.3f}"
            rows.append(
                (
                    lock["kind"],
                    lock["name"],
                    lock["holder"][:16],
                    ttl,
                    str(lock.get("fence", "-")),
                    str(lock.get("queued", "-")),
                )
            )
        return _table(rows)
    if command == "stats":
        lines = [f"namespace {result['namespace']!r}, from {result['metrics_url']}"]
        for name, count in sorted(result.get("counters", {}).items()):
            lines.append(f"  {name:<24} {count:>12.0f}")
        for measure in MEASURES:
            series = result.get(measure, {})
            for key in sorted(k for k in series if k.startswith("count[")):
                outcome = key[len("count[") : -1]
                count, total = series[key], series.get(f"sum[{outcome}]", 0.0)
                mean = f"{total / count * 1000:.1f} ms mean" if count else ""
                lines.append(f"  {measure + 's ' + outcome:<24} {count:>12.0f}  {mean}")
        return "\n".join(lines)
    return json.dumps(result, indent=2, default=str)


def _human_entry(entry: dict[str, Any]) -> str:
    lines = [("key", entry["key"])]
    state = entry["state"]
    if state == "absent":
        lines.append(("state", "absent (no value cached)"))
    else:
        lines.append(("state", f"{state} ({entry['size_bytes']} bytes)"))
    if state == "corrupt":
        lines.append(("problem", entry["problem"]))
    if "loaded_at" in entry:
        lines.append(("loaded", f"{entry['loaded_at']}, {entry['age_s']:.1f} s ago"))
        lines.append(("load took", f"{entry['load_duration_s'] * 1000:.1f} ms"))
        ttl = entry["ttl_s"]
        if ttl is None:
            lines.append(("ttl left", "no expiry"))
        elif ttl >= 0:
            stale = entry["stale_window_s"]
            lines.append(("ttl left", f"{ttl:.1f} s" + (f" (then {stale:g} s servable stale)" if stale else "")))
        else:
            lines.append(("ttl left", f"expired {-ttl:.1f} s ago: served stale while refreshed"))
    if entry["tags"]:
        lines.append(("tags", ", ".join(entry["tags"])))
    if entry["failing"]:
        lines.append(("failing", "yes: its last load failed (stale_if_error)"))
    lock = entry["lock"]
    held = f"held by {lock['holder']} for {lock['ttl_s']:.3f} s more" if lock["held"] else "free"
    lines.append(("lease", held))
    waiting = entry["waiting_processes"]
    lines.append(
        ("waiting", "unknown (the store cannot tell)" if waiting is None else f"{waiting} processes subscribed")
    )
    if "value" in entry:
        text = json.dumps(entry["value"], default=str)
        lines.append(("value", text if len(text) <= PREVIEW else text[:PREVIEW] + f"... ({len(text)} chars)"))
    return _table(lines, header=False)


def _table(rows: Sequence[Sequence[str]], header: bool = True) -> str:
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    if header:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


# --- the entry point -------------------------------------------------------------------

COMMANDS: dict[str, Callable[[Any, argparse.Namespace], Any]] = {
    "inspect": inspect,
    "invalidate": invalidate,
    "locks": locks,
    "stats": stats,
}


def _version() -> str:
    """What ``--version`` prints: stampede's version, and those of what it runs on (a bug
    report's first line)."""
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"stampede {__version__} (redis-py {redis.__version__}, Python {python})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stampede",
        description="Look at and act on a stampede cache on a Redis server.",
        epilog="A PATTERN is a glob over entries (category-map:*) or a template (category-map:{shop}) "
        "with FIELD=VALUE (a str) or FIELD:=JSON values.",
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--url", default=default_url()[1] or DEFAULT_URL, help="the store's URL")
    parser.add_argument("--cluster", action="store_true", help="the URL is a node of a Redis Cluster")
    parser.add_argument("--namespace", default=os.environ.get("STAMPEDE_NAMESPACE", "stampede"))
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect_ = commands.add_parser("inspect", help="one entry, or each matching one")
    inspect_.add_argument("pattern", metavar="PATTERN")
    inspect_.add_argument("fields", metavar="FIELD=VALUE", nargs="*")
    inspect_.add_argument("--limit", type=int, default=20, help="entries shown at most (default 20)")
    invalidate_ = commands.add_parser("invalidate", help="invalidate one entry, or count then invalidate many")
    invalidate_.add_argument("pattern", metavar="PATTERN")
    invalidate_.add_argument("fields", metavar="FIELD=VALUE", nargs="*")
    invalidate_.add_argument("--yes", action="store_true", help="invalidate what a pattern matches, not only count")
    invalidate_.add_argument("--tag", action="store_true", help="PATTERN is a tag: the entries that carry it")
    commands.add_parser("locks", help="leases held: named locks and loads in flight")
    stats_ = commands.add_parser("stats", help="a running app's counters, from its Prometheus metrics")
    stats_.add_argument("--metrics-url", help="the app's metrics endpoint, e.g. http://127.0.0.1:9100/metrics")
    commands.add_parser("demo", help="the demo: a stampede with and without protection", add_help=False)
    server_ = commands.add_parser("server", help="run a throwaway server on 127.0.0.1 until Ctrl-C (the dev extra's)")
    server_.add_argument("--port", type=int, default=6379, help="its port (default 6379, the docs' address)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["demo"]:
        return _demo(arguments[1:])
    parser = _parser()
    options, rest = parser.parse_known_args(arguments)
    if options.command == "demo":  # after global options, which it takes: --url is its --redis
        given = any(argument == "--url" or argument.startswith("--url=") for argument in arguments)
        return _demo((["--redis", options.url] if given else []) + rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if options.command == "server":
        return _server(options.port)
    try:
        result = _run(options)
    except Failed as failure:
        message = scrubbed(str(failure), options.url)
        if getattr(options, "metrics_url", None):
            message = scrubbed(message, options.metrics_url)
        print(f"stampede {options.command}: {message}", file=sys.stderr)
        return failure.status
    print(json.dumps(result, default=str) if options.json else _human(options.command, result))
    return 0


def _demo(arguments: list[str]) -> int:
    from .demo import main as demo

    demo(arguments)
    return 0


def _server(port: int) -> int:
    """A server to try the docs' snippets against: no persistence, bound to 127.0.0.1,
    stopped (by its PID) when this command is."""
    from .testing.servers import RedisServer

    with socket.socket() as probe:  # else start() would find the other server answering
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            print(f"stampede server: 127.0.0.1:{port} is taken ({error.strerror}); try --port", file=sys.stderr)
            return 1
    try:
        server = RedisServer(port=port).start()
    except RuntimeError as error:
        print(f"stampede server: {error}".strip(), file=sys.stderr)
        return 1
    print(f"a throwaway server at {server.url} (nothing is saved); Ctrl-C stops it", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a kill stops the server too
    try:
        assert server.process is not None
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _run(options: argparse.Namespace) -> Any:
    if options.command == "stats":
        return stats(None, options)
    try:
        session = Session(options.url, options.namespace, options.cluster)
        try:
            return COMMANDS[options.command](session, options)
        finally:
            session.close()
    except (InvalidKey, ConfigError) as error:
        raise Failed(str(error), 2) from None
    except (BackendUnavailable, redis.RedisError, OSError) as error:
        raise Failed(f"{redacted(options.url)}: {error}", 1) from None

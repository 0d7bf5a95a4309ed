"""What every Redis export test compares: the cache (each key's hash, read back into typed values) against what
the Delta table says (the latest row of each key, computed here in plain Python), and the export's state."""

from __future__ import annotations

from datetime import datetime

import redis

from laminar_assets.engine import Connection, Exporter, RedisExport
from laminar_assets.engine.delta.arrow_reads import read_arrow
from tests.engine.export.helpers import FLOW, Sink

REDIS_EXPORT = RedisExport(name="m1_cache", source="m1", connection="cache", key_prefix="pos", batch_rows=2)
_PARSE = {"window_start": datetime.fromisoformat, "window_end": datetime.fromisoformat, "ts": datetime.fromisoformat,
          "n": int, "id": int, "total": float, "px": float, "sym": str}


def exporter(root: str, url: str, **kw) -> Exporter:
    return Exporter(root, connections={"cache": Connection("cache", url)}, **kw)


def deliver(root: str, url: str, export: RedisExport = REDIS_EXPORT, source=FLOW, **kw):
    return exporter(root, url, **{k: kw.pop(k) for k in ("hook",) if k in kw}).deliver(export, source, **kw)


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def cache(url: str, prefix: str = "pos") -> dict[str, dict]:
    """Every key of the prefix: its fields parsed back into values (the version field apart, as `_v`)."""
    out = {}
    with client(url) as c:
        for key in c.scan_iter(match=f"{prefix}:*"):
            fields = c.hgetall(key)
            version = fields.pop("_laminar_version")
            out[key] = {**{k: _PARSE.get(k, str)(v) for k, v in fields.items()}, "_v": int(version)}
    return out


def expected(sink: Sink, group: tuple[str, ...] = ("sym",), time: str = "window_start", prefix: str = "pos",
             version: int | None = None) -> dict[str, dict]:
    """What the cache must hold for the Delta table at `version`: per value of `group`, its row of the latest
    `time`, all columns (none of them NULL here)."""
    from deltalake import DeltaTable

    rows = read_arrow(sink.uri, DeltaTable(sink.uri, version=version)).to_pylist()
    best: dict[str, dict] = {}
    for row in rows:
        key = ":".join([prefix, *(str(row[g]) for g in group)])
        if key not in best or row[time] > best[key][time]:
            best[key] = row
    return best


def without_versions(got: dict[str, dict]) -> dict[str, dict]:
    return {k: {f: v for f, v in fields.items() if f != "_v"} for k, fields in got.items()}


def state(url: str, export: str = "m1_cache") -> dict:
    with client(url) as c:
        return c.hgetall(f"laminar:exports:{export}")


def assert_equal(url: str, sink: Sink, *, group: tuple[str, ...] = ("sym",), time: str = "window_start",
                 prefix: str = "pos", export: str = "m1_cache") -> None:
    """The cache holds exactly the latest row of each key of the table, every key stamped with a delivered version
    no newer than the state's, and the state holds the table's version (and no unfinished delivery)."""
    got = cache(url, prefix)
    want = expected(sink, group, time, prefix)
    assert without_versions(got) == want, (got, want)
    held = state(url, export)
    assert int(held["version"]) == sink.version() and "pending" not in held, held
    assert all(fields["_v"] <= sink.version() for fields in got.values())

"""The Redis target (redis-py): one hash per key of the source (`<key_prefix>:<values>`, see `redis_rows`) holding
the latest row of that key as the source's Delta table says at the delivered version, idempotent.

Redis has no transaction that spans a delivery, so a delivery is a series of atomic steps (Lua scripts), the
export's delivered version last:

    begin      the export's state (`laminar:exports:<export>`) still holds the version the delivery read, and no
               other delivery is writing (or the one that was is past its lease): mark this one as writing
    write      one script per batch of keys: each key's hash replaced by its new row, or the key removed; in an
               incremental delivery a key whose `_laminar_version` is newer than this delivery's is left alone
    remove     (a full resync) keys of the prefix the table no longer has (SCAN, in batches)
    finish     the state's version moves to the delivered one, the writing mark goes

A delivery that stops between `begin` and `finish` (killed, Redis gone) leaves its mark: its keys may already
hold rows of a newer version than the state's, so the next delivery is a full resync (TARGET_CHANGED), which
takes over once the mark's lease (renewed by every step) has run out, or at once when the delivery that left it
failed cleanly. A step of a delivery that lost the mark, or whose read version moved, writes nothing.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from laminar_assets.errors import ConcurrentDeliveryError, ExportError, ExportTargetError, InjectedCrash

from ..spec.exports import RedisExport
from . import redis_rows as rr
from .connections import Connection
from .protocol import Applied, Changes, Delivered, Mode, TargetContext

STATE_PREFIX = "laminar:exports:"  # + the export's name: its delivered version (a hash)
CONNECT_SECONDS = 5
READ_SECONDS = 30
# What a delivery runs: HGETALL and SCAN, the scripts (EVALSHA, SCRIPT LOAD) and, inside them, HSET, DEL, TYPE,
# EXPIRE and TIME; CLIENT SETNAME names the connection. Plus the keys: the prefix's and the export's state.
REQUIRED_ACL = "+@connection +@read +@write +@scripting +@keyspace +time"
RESYNC_TTL_SECONDS = 86_400  # the keys a full resync wrote, kept while it runs (dropped at its end)

_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""
# KEYS: state, resync. ARGV: token, expected version ('' none), pending token seen ('' none), lease ms, full, version
BEGIN = _NOW_MS + """
local held = redis.call('HGET', KEYS[1], 'version') or ''
if held ~= ARGV[2] then return {'moved', held} end
local pending = redis.call('HGET', KEYS[1], 'pending')
local now = now_ms()
if pending and pending ~= ARGV[1] then
  local lease = tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') or 0
  if pending ~= ARGV[3] or lease > now then
    return {'busy', redis.call('HGET', KEYS[1], 'pending_version') or '?', tostring(math.max(lease - now, 0))}
  end
end
redis.call('HSET', KEYS[1], 'pending', ARGV[1], 'pending_version', ARGV[6], 'pending_since', tostring(now),
           'lease_until', tostring(now + tonumber(ARGV[4])))
if ARGV[5] == '1' then redis.call('DEL', KEYS[2]) end
return {'ok'}
"""
# KEYS: state, resync, key... ARGV: token, version, full, lease ms, resync ttl, then per key: op ('s'/'d'), time,
# number of fields, field, value, ...
WRITE = _NOW_MS + """
if redis.call('HGET', KEYS[1], 'pending') ~= ARGV[1] then return {'lost'} end
for i = 3, #KEYS do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'none' and (kind ~= 'hash' or redis.call('HEXISTS', KEYS[i], '_laminar_version') == 0) then
    return {'foreign', KEYS[i], kind}
  end
end
local version, full = tonumber(ARGV[2]), ARGV[3] == '1'
local written, removed, skipped, a = 0, 0, 0, 6
for i = 3, #KEYS do
  local key, op, at, n = KEYS[i], ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local stored = redis.call('HGET', key, '_laminar_version')
  local newer = (not full) and stored and tonumber(stored) > version
  if newer then
    skipped = skipped + 1
  elseif op == 'd' then
    if stored then redis.call('DEL', key); removed = removed + 1 end
  else
    -- a full resync keeps, per key it wrote, '<time>:<1 when counted as changed>': a later row of the key replaces
    -- an earlier one of the same resync, and a key is counted once
    local go, counted = true, false
    if full then
      local seen = redis.call('HGET', KEYS[2], key)
      if seen then
        local t, c = string.match(seen, '^(-?%d+):(%d)$')
        if tonumber(t) >= tonumber(at) then go = false end
        counted = c == '1'
      end
    end
    if go then
      local same = stored ~= false and redis.call('HLEN', key) == n + 1
      local j = a + 3
      while same and j < a + 3 + 2 * n do
        if redis.call('HGET', key, ARGV[j]) ~= ARGV[j + 1] then same = false end
        j = j + 2
      end
      if same then
        redis.call('HSET', key, '_laminar_version', ARGV[2])
      else
        redis.call('DEL', key)
        redis.call('HSET', key, '_laminar_version', ARGV[2], unpack(ARGV, a + 3, a + 2 + 2 * n))
        if not counted then written = written + 1 end
        counted = true
      end
      if full then redis.call('HSET', KEYS[2], key, at .. ':' .. (counted and '1' or '0')) end
    end
  end
  a = a + 3 + 2 * n
end
if full then redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5])) end
redis.call('HSET', KEYS[1], 'lease_until', tostring(now_ms() + tonumber(ARGV[4])))
return {'ok', written, removed, skipped}
"""
# KEYS: state, resync, key... ARGV: token, lease ms. Removes the keys this full resync did not write.
REMOVE = _NOW_MS + """
if redis.call('HGET', KEYS[1], 'pending') ~= ARGV[1] then return {'lost'} end
local removed = 0
for i = 3, #KEYS do
  if redis.call('HEXISTS', KEYS[2], KEYS[i]) == 0 and redis.call('TYPE', KEYS[i]).ok == 'hash'
      and redis.call('HEXISTS', KEYS[i], '_laminar_version') == 1 then
    redis.call('DEL', KEYS[i]); removed = removed + 1
  end
end
redis.call('HSET', KEYS[1], 'lease_until', tostring(now_ms() + tonumber(ARGV[2])))
return {'ok', removed}
"""
# KEYS: state, resync. ARGV: token, expected version, field, value, ...
FINISH = """
if redis.call('HGET', KEYS[1], 'pending') ~= ARGV[1] then return {'lost'} end
local held = redis.call('HGET', KEYS[1], 'version') or ''
if held ~= ARGV[2] then return {'moved', held} end
redis.call('HDEL', KEYS[1], 'pending', 'pending_version', 'pending_since', 'lease_until')
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('DEL', KEYS[2])
return {'ok'}
"""
# KEYS: state. ARGV: token, '1' when nothing was written (the mark goes), else the lease ends now.
RELEASE = """
if redis.call('HGET', KEYS[1], 'pending') ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then
  redis.call('HDEL', KEYS[1], 'pending', 'pending_version', 'pending_since', 'lease_until')
else
  redis.call('HSET', KEYS[1], 'lease_until', '0')
end
return 1
"""


def state_key(export_name: str) -> str:
    """The hash holding an export's delivered version (and, while a delivery writes, its mark)."""
    return f"{STATE_PREFIX}{export_name}"


class RedisTarget:
    """The target of a `RedisExport` over one connection (a redis:// or rediss:// URL; opened on first use)."""

    lease_seconds = 60.0  # how long a delivery that stopped writing keeps others out (renewed by each step)

    def __init__(self, export: RedisExport, connection: Connection, context: TargetContext) -> None:
        self.export = export
        self.connection = connection
        self.context = context
        parts = urlsplit(connection.url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ExportTargetError(f"export '{export.name}': connection '{connection.name}' is not a Redis URL "
                                    f"({connection.safe_url}); expected redis://[user[:password]@]host:6379/0",
                                    export=export.name, connection=connection.name)
        try:
            port = parts.port
        except ValueError:
            port = None
            self._unusable(f"its port is not a number ({parts.netloc.rsplit(':', 1)[-1]!r})")
        query = parse_qs(parts.query)
        db = query["db"][0] if "db" in query else "" if parts.scheme == "unix" else unquote(parts.path).strip("/")
        if db and not db.isdigit():  # redis-py would quietly write into database 0
            self._unusable(f"its database {db!r} is not a number")
        self.where = {"host": parts.path if parts.scheme == "unix" else (parts.hostname or "localhost"),
                      "port": port or (None if parts.scheme == "unix" else 6379), "db": db or "0",
                      "user": unquote(parts.username) if parts.username else "default"}
        self.state = state_key(export.name)
        self.resync = f"{self.state}:resync"
        self.token = uuid.uuid4().hex
        self._client: redis.Redis | None = None
        self._scripts: dict = {}
        self._seen_pending = ""  # the mark of an unfinished delivery `delivered()` saw (a full resync may take over)
        self._begun = self._attempted = False

    def _unusable(self, why: str) -> None:
        raise ExportTargetError(f"export '{self.export.name}': connection '{self.connection.name}' is not a usable Redis "
                                f"URL ({self.connection.safe_url}): {why}; expected redis://[user[:password]@]host:6379/0",
                                export=self.export.name, connection=self.connection.name)

    # --- where -------------------------------------------------------------------------
    def describe(self) -> str:
        w = self.where
        return (f"Redis keys {self.export.key_prefix}:* on host={w['host']} port={w['port']} db={w['db']} "
                f"user={w['user']}")

    def _at(self) -> str:
        w = self.where
        return f"host={w['host']} port={w['port']} db={w['db']}"

    def _client_(self) -> redis.Redis:
        if self._client is None:
            password = self.connection.option("password")
            try:
                self._client = redis.Redis.from_url(
                    self.connection.url, socket_connect_timeout=CONNECT_SECONDS, socket_timeout=READ_SECONDS,
                    retry=Retry(NoBackoff(), 0), client_name=f"laminar-export-{self.export.name}",
                    **({"password": password} if password else {}))
            except ValueError as exc:
                raise ExportTargetError(f"export '{self.export.name}': connection '{self.connection.name}' is not a "
                                        f"usable Redis URL ({self.connection.safe_url}): {_first(exc)}",
                                        export=self.export.name, connection=self.connection.name) from None
            self._scripts = {name: self._client.register_script(body) for name, body in
                             (("begin", BEGIN), ("write", WRITE), ("remove", REMOVE), ("finish", FINISH),
                              ("release", RELEASE))}
        return self._client

    def _failure(self, exc: redis.RedisError, doing: str) -> ExportError:
        """One line for a Redis failure: never the URL or a password, only host, port, db and user."""
        name, user, cause = self.export.name, self.where["user"], _first(exc)
        where: dict[str, Any] = {**self.where, "connection": self.connection.name}
        if isinstance(exc, redis.AuthenticationError) or re.search(r"WRONGPASS|NOAUTH|invalid password", cause, re.I):
            return ExportTargetError(f"export '{name}': Redis at {self._at()} refused the credentials of user '{user}' "
                                     f"({_without_secret(cause)}); check the password of connection "
                                     f"'{self.connection.name}'", export=name, **where)
        # a command the user may not run inside a script comes back as a plain error, not NOPERM
        if isinstance(exc, redis.exceptions.NoPermissionError) or "can't run this command" in cause:
            cause = re.sub(r" script: [0-9a-f]{40}, on @user_script:\d+", "", cause)
            return ExportTargetError(f"export '{name}': Redis user '{user}' at {self._at()} lacks a permission to "
                                     f"{doing} ({cause}); grant it, e.g. ACL SETUSER {user} {REQUIRED_ACL} "
                                     f"~{self.export.key_prefix}:* ~{self.state}*; nothing more was written",
                                     export=name, **where)
        if isinstance(exc, redis.ConnectionError) and "closed by server" in cause:
            return ExportTargetError(f"export '{name}': the server at {self._at()} closed the connection without a Redis "
                                     f"answer while it tried to {doing}; is it a Redis server (not another service on "
                                     f"that port), and does it take plain connections (rediss:// for TLS)? check the "
                                     f"host and port of connection '{self.connection.name}'", export=name,
                                     retryable=True, **where)
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError)):
            return ExportTargetError(f"export '{name}': cannot reach Redis at {self._at()} as user '{user}' ({cause}) "
                                     f"while it tried to {doing}; is the server running and reachable?", export=name,
                                     retryable=True, **where)
        if "Protocol Error" in cause or isinstance(exc, redis.exceptions.InvalidResponse):
            return ExportTargetError(f"export '{name}': what answers at {self._at()} is not a Redis server ({cause}); "
                                     f"check the host and port of connection '{self.connection.name}'", export=name,
                                     **where)
        if isinstance(exc, redis.exceptions.ReadOnlyError):
            return ExportTargetError(f"export '{name}': Redis at {self._at()} is a read-only replica ({cause}); point "
                                     f"connection '{self.connection.name}' at the primary", export=name, **where)
        return ExportError(f"export '{name}': Redis at {self._at()} refused to {doing}: {cause}", export=name, **where)

    def _run(self, script: str, keys: list, args: list, doing: str):
        client = self._client_()
        try:
            return self._scripts[script](keys=keys, args=args, client=client)
        except redis.RedisError as exc:
            raise self._failure(exc, doing) from None

    # --- the protocol ------------------------------------------------------------------
    def delivered(self) -> Delivered | None:
        client = self._client_()
        try:
            state = {_s(k): _s(v) for k, v in cast(dict, client.hgetall(self.state)).items()}  # a sync client's answer
        except redis.RedisError as exc:
            raise self._failure(exc, "read the delivered version") from None
        self._seen_pending = state.get("pending", "")
        if "version" not in state:
            return None
        version = int(state["version"])
        changed = None
        if state.get("pending"):
            changed = (f"a delivery to version {state.get('pending_version', '?')} did not finish (interrupted or "
                       f"overlapped), so keys of {self.export.key_prefix}:* may hold rows newer than version {version}")
        elif state.get("key_prefix", self.export.key_prefix) != self.export.key_prefix:
            changed = (f"version {version} was delivered under key prefix '{state['key_prefix']}', not "
                       f"'{self.export.key_prefix}'")
        at = None
        if state.get("delivered_at"):
            at = datetime.fromisoformat(state["delivered_at"])
        return Delivered(version, state.get("source_table_id") or None, at, changed)

    def apply(self, changes: Changes) -> Applied:
        try:
            return self._apply(changes)
        except InjectedCrash:
            raise  # a simulated kill: the mark stays until its lease runs out
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    # --- one delivery ------------------------------------------------------------------
    def _apply(self, changes: Changes) -> Applied:
        if changes.source is None or changes.pinned is None:
            raise ExportError(f"export '{self.export.name}': the Redis target needs the source spec and its pinned "
                              "table with the changes", export=self.export.name)
        group, time = tuple(changes.source.key_columns), changes.source.output_time_column
        expected = "" if changes.expected is None else str(changes.expected.version)
        full = changes.mode is Mode.FULL
        answer = self._run("begin", [self.state, self.resync],
                           [self.token, expected, self._seen_pending, self._lease_ms(), int(full), changes.version],
                           "begin a delivery")
        self._check(answer, expected)
        self._begun = True
        counts = [0, 0, 0]
        if full:
            for batch in changes.rows:
                rows = rr.latest(rr.keyed(pa.Table.from_batches([batch]), self.export.prefix, group, time,
                                          self.export.name))
                self._write(rows, None, changes, counts)
            counts[1] += self._remove_stale(group)
        else:
            keys = rr.affected([pa.Table.from_batches([b]) for b in changes.rows], changes.deletes,
                               self.export.prefix, group, time, self.export.name)
            dataset = changes.pinned.dataset()
            upserted = pc.is_valid(keys.column(rr.TIME))  # read apart: a key only deleted has no lower bound of time
            # in order of time, so a batch's lower bound (its earliest upserted row) skips the files of older windows
            for part in (*rr.chunks(keys.filter(upserted).sort_by([(rr.TIME, "descending"), (rr.KEY, "ascending")]),
                                    self.export.batch_rows),
                         *rr.chunks(keys.filter(pc.invert(upserted)), self.export.batch_rows)):
                found = rr.rows_of_keys(dataset, changes.schema, part, self.export.prefix, group, time,
                                        self.export.name, self.export.batch_rows)
                gone = part.filter(pc.invert(pc.is_in(part.column(rr.KEY), value_set=found.column(rr.KEY))))
                self._write(found, gone.column(rr.KEY).to_pylist(), changes, counts)
        self.context.hook("export_after_rows")
        now = datetime.now(UTC).isoformat()
        record = {"version": changes.version, "source_table": changes.source_table,
                  "source_table_id": changes.source_table_id or "", "delivered_at": now, "mode": changes.mode.value,
                  "reason": changes.reason.value, "rows_upserted": counts[0], "rows_deleted": counts[1],
                  "key_prefix": self.export.key_prefix}
        answer = self._run("finish", [self.state, self.resync],
                           [self.token, expected, *[x for kv in record.items() for x in kv]], "record the delivered version")
        self._check(answer, expected)
        self._begun = False
        self.context.hook("export_after_version")
        return Applied(rows_upserted=counts[0], rows_deleted=counts[1],
                       extra={"keys_skipped_newer": counts[2]} if counts[2] else {})

    def _write(self, rows: pa.Table, gone: list | None, changes: Changes, counts: list[int]) -> None:
        """Replace the hashes of `rows`' keys by their rows and remove the keys `gone`, in batches of one script."""
        columns = [c for c in changes.schema.names]
        full = changes.mode is Mode.FULL
        for part in rr.chunks(rows, self.export.batch_rows):
            names, times = part.column(rr.KEY).to_pylist(), part.column(rr.TIME).to_pylist()
            args: list = []
            for key_fields, at in zip(rr.fields(part, columns), times):
                args += ("s", at, len(key_fields) // 2, *key_fields)
            self._write_batch(names, args, changes.version, full, counts)
        gone = gone or []
        for start in range(0, len(gone), self.export.batch_rows):
            names = gone[start:start + self.export.batch_rows]
            self._write_batch(names, [x for _ in names for x in ("d", 0, 0)], changes.version, full, counts)

    def _write_batch(self, names: list, per_key: list, version: int, full: bool, counts: list[int]) -> None:
        if not names:
            return
        before, self._attempted = self._attempted, True  # unknown until the script answers
        answer = self._run("write", [self.state, self.resync, *names],
                           [self.token, version, int(full), self._lease_ms(), RESYNC_TTL_SECONDS, *per_key],
                           f"write keys of {self.export.key_prefix}:*")
        if _s(answer[0]) != "ok":
            self._attempted = before  # the script wrote nothing
        if _s(answer[0]) == "foreign":
            raise ExportError(f"export '{self.export.name}': Redis key '{_s(answer[1])}' at {self._at()} holds a "
                              f"{_s(answer[2])} that Laminar did not write (a hash with a _laminar_version field is "
                              f"its); the keys {self.export.key_prefix}:* are the export's: delete it, or give the "
                              "export another key_prefix; this batch wrote nothing", export=self.export.name)
        self._check(answer, None)
        counts[0] += int(answer[1])
        counts[1] += int(answer[2])
        counts[2] += int(answer[3])

    def _remove_stale(self, group: tuple[str, ...]) -> int:
        """Remove the export's keys a full resync did not write (SCAN of its prefix, in batches)."""
        prefix = self.export.prefix
        client = self._client_()
        removed = 0
        batch: list[bytes] = []
        if not group:  # one key, the prefix itself
            candidates = iter([prefix.encode()])
        else:
            pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + ":*"
            candidates = client.scan_iter(match=pattern, count=self.export.batch_rows)

        def flush() -> int:
            answer = self._run("remove", [self.state, self.resync, *batch], [self.token, self._lease_ms()],
                               f"remove keys of {prefix}:* the table no longer has")
            self._check(answer, None)
            batch.clear()
            return int(answer[1])

        try:
            for name in candidates:
                suffix = name.decode("utf-8", "replace")[len(prefix) + 1:]
                if group and rr.part_count(suffix) != len(group):
                    continue  # not a key of this export's shape (another prefix below this one)
                batch.append(name)
                if len(batch) >= self.export.batch_rows:
                    removed += flush()
        except redis.RedisError as exc:
            raise self._failure(exc, f"list the keys of {prefix}:*") from None
        if batch:
            removed += flush()
        return removed

    def _check(self, answer, expected: str | None) -> None:
        what = _s(answer[0])
        if what == "ok":
            return
        name = self.export.name
        if what == "moved":
            raise ConcurrentDeliveryError(
                f"export '{name}': another delivery moved the delivered version in {self.state} to "
                f"{_s(answer[1]) or 'none'} (this one read {expected or 'none'}); this one stopped, the next one "
                "delivers from there", export=name)
        if what == "busy":
            seconds = int(_s(answer[2])) / 1000
            raise ConcurrentDeliveryError(
                f"export '{name}': another delivery (to version {_s(answer[1])}) is writing its keys, or stopped less "
                f"than {self.lease_seconds:g} s ago ({seconds:.0f} s left of its lease); try again after it (a full "
                "resync then takes over)", export=name)
        raise ConcurrentDeliveryError(f"export '{name}': another delivery took over the keys while this one wrote; this "
                                      "one stopped (the one that took over resyncs every key)", export=name)

    def _release(self) -> None:
        """After a failure: end this delivery's lease (the next one takes over with a full resync), or drop its mark
        when it wrote nothing."""
        if not self._begun or self._client is None:
            return
        try:
            self._scripts["release"](keys=[self.state], args=[self.token, "0" if self._attempted else "1"],
                                     client=self._client)
        except redis.RedisError:
            pass  # Redis is gone: the lease runs out by itself

    def _lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _first(exc: BaseException) -> str:
    """The cause in a redis-py message: 'Error 111 connecting to host:port. Connection refused.' -> 'Connection
    refused'."""
    text = " ".join(str(exc).split())
    found = re.match(r"Error -?\d+ (?:connecting to|while writing to|reading from) \S+?\.? (.+)$", text)
    return _without_secret((found.group(1) if found else text).rstrip(".")) or type(exc).__name__


def _without_secret(text: str) -> str:
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)

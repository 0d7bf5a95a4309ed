"""Connections: how a delivery reaches an export's target. Plain objects the engine receives (no Dagster); the
Dagster resource (`LaminarResource(connections={...})`) or the environment defines them, never a flow file.

    LAMINAR_CONNECTION_<NAME>_URL        the target's URL (postgresql://user@host:5432/db, redis://..., https://...)
    LAMINAR_CONNECTION_<NAME>_PASSWORD   optional: a password kept out of the URL
    LAMINAR_CONNECTION_<NAME>_TOKEN      optional: a bearer token (webhooks)

A connection's `repr` and `describe()` never show a secret: the password of the URL, and every option whose
name says it holds one (password, token, secret, key, authorization), show as `***`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from laminar_assets.errors import ExportError

ENV_PREFIX = "LAMINAR_CONNECTION_"
ENV_OPTIONS = ("password", "token")  # besides the URL, what the environment may give a connection
_SECRET = re.compile(r"pass|token|secret|key|auth|cred", re.IGNORECASE)
MASK = "***"


@dataclass(frozen=True, repr=False)
class Connection:
    """A named way to reach a target: its URL and options (e.g. a password kept apart from the URL)."""

    name: str
    url: str
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", dict(self.options or {}))

    @property
    def safe_url(self) -> str:
        """The URL with its password (and query values that look secret) masked."""
        return mask_url(self.url)

    def option(self, name: str, default: str | None = None) -> str | None:
        return self.options.get(name, default)

    def __repr__(self) -> str:
        shown = {k: (MASK if _SECRET.search(k) else v) for k, v in self.options.items()}
        return f"Connection(name={self.name!r}, url={self.safe_url!r}, options={shown!r})"

    __str__ = __repr__


def mask_url(url: str) -> str:
    """`url` without its secrets: user:password@ -> user:***@, ?password=x -> ?password=***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{user}@{host}"
    query = "&".join(f"{k}={MASK}" if _SECRET.search(k) else f"{k}={v}" if v is not None else k
                     for k, v in (q.split("=", 1) if "=" in q else (q, None) for q in parts.query.split("&") if q))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def env_name(connection: str, what: str = "url") -> str:
    """The environment variable that gives `what` of a connection: LAMINAR_CONNECTION_ANALYTICS_URL."""
    return f"{ENV_PREFIX}{connection.upper()}_{what.upper()}"


def from_environment(name: str, environ: Mapping[str, str] | None = None) -> Connection | None:
    """The connection `name` as the environment defines it (read when called, never at import); None when
    LAMINAR_CONNECTION_<NAME>_URL is not set."""
    environ = os.environ if environ is None else environ
    url = environ.get(env_name(name))
    if not url:
        return None
    return Connection(name, url, {o: environ[env_name(name, o)] for o in ENV_OPTIONS if environ.get(env_name(name, o))})


def resolve(export_name: str, name: str, given: Mapping[str, Connection] | None, *, example: str = "") -> Connection:
    """The connection an export names: one given (by the Dagster resource or the caller), else the
    environment's; an `ExportError` of one line when neither defines it (`example`: a URL of the export's kind)."""
    if given and name in given:
        return given[name]
    found = from_environment(name)
    if found is not None:
        return found
    like = f"e.g. {example}, " if example else ""
    raise ExportError(f"export '{export_name}' names connection '{name}', which is not defined: set "
                      f"{env_name(name)} ({like}with {env_name(name, 'password')} for the password), or give "
                      f"LaminarResource(connections={{'{name}': ...}})", export=export_name, connection=name)


def connections_of(urls: Mapping[str, str] | None, options: Mapping[str, Mapping[str, str]] | None = None
                   ) -> dict[str, Connection]:
    """Connections from name -> URL (and name -> options), as a resource's config gives them."""
    return {name: Connection(name, url, dict((options or {}).get(name) or {})) for name, url in (urls or {}).items()}

"""A Hive metastore database on Postgres: how `SparkOptions.metastore` names it, the JVM settings of Spark's Hive
client for it, and a check, before a JVM is started, that the database takes the credentials.

The user names it as Dagster's storage is named (`dagster.postgres.yaml`): `postgresql://user:password@host:5432/
metastore` (`postgres://` and a SQLAlchemy driver suffix such as `postgresql+psycopg2://` are taken too, so the
same server's URL can be copied), or as a JDBC URL (`jdbc:postgresql://host:5432/metastore?user=...&password=...`).
The password may be left out of the URL and given in LAMINAR_METASTORE_PASSWORD instead.

Spark's Hive client (Hive 2.3 in the pyspark wheel) reaches the database through DataNucleus and PostgreSQL's JDBC
driver (the `postgres` jar group, engine/spark/jars.py), which speaks TCP only: a URL naming a Unix socket directory
(`?host=/run/postgresql`) is refused with a line saying so. Hive's tables are created by DataNucleus on first use
(`datanucleus.schema.autoCreateAll`, as for the embedded Derby): Hive's own `schematool` needs the SQL scripts of a
Hive distribution, which the pyspark wheel does not ship.

The password never reaches a command line, a log or a message: a JVM Laminar starts as a process of its own (the
Spark Connect server of `laminar serve`) gets it in its environment (LAMINAR_METASTORE_PASSWORD), and its Hive
setting only refers to it (`${env.LAMINAR_METASTORE_PASSWORD}`, expanded by Hadoop's Configuration when Hive reads
it); messages name the database as `user@host:port/database`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from laminar_assets.errors import CatalogError, EnvironmentProblem

PASSWORD_ENV = "LAMINAR_METASTORE_PASSWORD"
DRIVER = "org.postgresql.Driver"
SCHEMES = ("postgresql", "postgres")
# How long reaching the database may take before a clear failure: pgjdbc's connect and login bounds (seconds),
# and psycopg's for the check before a JVM starts. pgjdbc's own defaults wait 10 s to connect and forever to log in.
CONNECT_TIMEOUT = 5
LOGIN_TIMEOUT = 10
LOCK_TIMEOUT = 30
WAREHOUSE = ".laminar/warehouse"
# Hive's persistent classes (the metastore jar's package.jdo): their tables are all created when a JVM's Hive client
# starts (DataNucleus's auto-start), before any transaction. Created one by one as Hive first touches each class, a
# table's foreign key to TBLS waits for the lock that the same client's open transaction (a CREATE TABLE's) holds on
# TBLS, on another connection: on Postgres that wait never ends.
HIVE_MODEL = tuple(f"org.apache.hadoop.hive.metastore.model.{name}" for name in (
    "MDatabase MFieldSchema MType MTable MConstraint MSerDeInfo MOrder MColumnDescriptor MStringList MStorageDescriptor "
    "MPartition MIndex MRole MRoleMap MGlobalPrivilege MDBPrivilege MTablePrivilege MPartitionPrivilege "
    "MTableColumnPrivilege MPartitionColumnPrivilege MPartitionEvent MMasterKey MDelegationToken "
    "MTableColumnStatistics MPartitionColumnStatistics MVersionTable MResourceUri MFunction MNotificationLog "
    "MNotificationNextId").split())


@dataclass(frozen=True)
class MetastoreDatabase:
    """A Hive metastore database on Postgres (its credentials kept out of `repr`)."""

    host: str
    port: int
    database: str
    user: str
    password: str = field(default="", repr=False)
    params: tuple[tuple[str, str], ...] = ()  # pgjdbc's connection options (sslmode, ...), as given

    @property
    def where(self) -> str:
        """The database for messages: user@host:port/database, never the password."""
        return f"{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def jdbc_url(self) -> str:
        """The JDBC URL Hive connects with: no credentials (they are settings of their own), bounded waits."""
        options = dict(self.params)
        options.setdefault("connectTimeout", str(CONNECT_TIMEOUT))
        options.setdefault("loginTimeout", str(LOGIN_TIMEOUT))
        # a statement waiting on a lock fails after LOCK_TIMEOUT instead of waiting for ever
        options.setdefault("options", f"-c lock_timeout={LOCK_TIMEOUT * 1000}")
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}?{urlencode(options, quote_via=quote)}"


def postgres_metastore(metastore: str | None) -> MetastoreDatabase | None:
    """The Postgres database `metastore` names, or None when it names something else (a folder: Derby; another
    JDBC URL). A Postgres URL Laminar cannot use (a socket directory, no database) is an EnvironmentProblem."""
    if not metastore:
        return None
    text = metastore.strip()
    jdbc = text.startswith("jdbc:postgresql:")
    scheme = text.split("://", 1)[0].split("+", 1)[0] if "://" in text else ""
    if not jdbc and scheme not in SCHEMES:
        return None
    url = urlsplit(text[len("jdbc:"):] if jdbc else text)
    params = dict(parse_qsl(url.query, keep_blank_values=True))
    user = params.pop("user", None) or unquote(url.username or "")
    password = params.pop("password", None) or unquote(url.password or "") or os.environ.get(PASSWORD_ENV, "")
    shown = f"{url.hostname or ''}:{url.port or 5432}{url.path}"  # for messages: no credentials
    if "host" in params or not url.hostname:
        raise EnvironmentProblem(
            f"the metastore database URL (postgresql://...{shown}) names no TCP host: Spark's Hive client reaches "
            "Postgres through its JDBC driver, which connects over TCP only (not a Unix socket). Name the server as "
            "postgresql://user:password@host:5432/database", field="metastore")
    database = url.path.lstrip("/")
    if not database or "/" in database:
        raise EnvironmentProblem(f"the metastore database URL (postgresql://{shown}) names no database: end it with "
                                 "/<database>, e.g. postgresql://user:password@host:5432/metastore", field="metastore")
    if not user:
        raise EnvironmentProblem(f"the metastore database URL (postgresql://{shown}) names no user: "
                                 "postgresql://user:password@host:5432/database", field="metastore")
    return MetastoreDatabase(url.hostname, url.port or 5432, unquote(database), user, password,
                             tuple(sorted(params.items())))


def postgres_conf(db: MetastoreDatabase, *, secrets: bool = True) -> dict[str, str]:
    """Spark's settings for Hive's client on `db`. The password setting refers to the JVM's environment instead of
    holding it with `secrets=False` (a JVM given `metastore_env`), and when this process's environment holds it already
    (LAMINAR_METASTORE_PASSWORD: a JVM pyspark starts inherits it), so it is on no command line."""
    referred = not secrets or (bool(db.password) and os.environ.get(PASSWORD_ENV) == db.password)
    return {
        "spark.hadoop.javax.jdo.option.ConnectionURL": db.jdbc_url,
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": DRIVER,
        "spark.hadoop.javax.jdo.option.ConnectionUserName": db.user,
        "spark.hadoop.javax.jdo.option.ConnectionPassword": "${env." + PASSWORD_ENV + "}" if referred else db.password,
        # a database that refuses or does not answer fails the statement once, not after Hive's ten attempts two
        # seconds apart (each a pgjdbc connect of up to CONNECT_TIMEOUT)
        "spark.hadoop.hive.hmshandler.retry.attempts": "1",
        "spark.hadoop.datanucleus.autoStartMechanism": "Classes",
        "spark.hadoop.datanucleus.autoStartClassNames": ",".join(HIVE_MODEL),
        # where a schema's folder goes when it is created (Laminar's tables are external: nothing is written there
        # but the empty folder), beside the project's lake rather than Spark's `./spark-warehouse`
        "spark.sql.warehouse.dir": os.path.abspath(WAREHOUSE),
    }


def metastore_env(metastore: str | None) -> dict[str, str]:
    """The environment a JVM started as a process of its own needs for `metastore` (the database's password)."""
    db = postgres_metastore(metastore)
    return {PASSWORD_ENV: db.password} if db is not None and db.password else {}


def check_metastore(metastore: str | None, timeout: float = CONNECT_TIMEOUT) -> None:
    """Before a JVM starts with `metastore`: a Postgres metastore database must take the user and password, within
    `timeout` seconds. A wrong password, an unreachable server, a missing database is one CatalogError line naming
    the database (never the password) and what to do; other metastores are not checked here."""
    db = postgres_metastore(metastore)
    if db is None:
        return
    import psycopg

    # libpq's TLS settings, passed through as keywords: Any, as connect's own keywords are typed otherwise
    params: dict[str, Any] = {k: v for k, v in db.params if k in ("sslmode", "sslrootcert", "sslcert", "sslkey")}
    started = time.monotonic()
    try:
        with psycopg.connect(host=db.host, port=db.port, dbname=db.database, user=db.user, password=db.password,
                             connect_timeout=max(1, int(timeout)), **params) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        said = " ".join(str(exc).split()) or type(exc).__name__
        if len(db.password) >= 4:  # Postgres does not echo it; never let it through if it did
            said = said.replace(db.password, "***")
        if "password authentication failed" in said or "no password supplied" in said:
            hint = (f"check the password of {db.user} (in LAMINAR_METASTORE / SparkOptions.metastore, or "
                    f"{PASSWORD_ENV})")
        elif "does not exist" in said and "database" in said:
            hint = (f"create the database once (CREATE DATABASE {db.database}); Hive's tables in it are created on "
                    "first use")
        else:
            hint = (f"is Postgres running and reachable at {db.host}:{db.port}? (waited "
                    f"{time.monotonic() - started:.1f} s)")
        raise CatalogError(f"the Hive metastore database {db.where} cannot be used: {said}; {hint}",
                           metastore=f"postgresql://{db.where}") from None

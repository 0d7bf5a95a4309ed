"""Dead letters: the rows a webhook export could not deliver, kept in a Delta table per export,
`<root>/_laminar/dead_letters/<export>`, so a team can see, query (`laminar sql "SELECT * FROM
laminar_system.dead_letters"`) and replay them; the export goes on without them instead of blocking its flow.

One row per dead letter: the export and its source, the row's idempotency key, what was sent (`op`: insert or
retract), the source table's version that made the change and the row's partition, the HTTP status of the last
answer (NULL when no answer came: a timeout, a refused or dropped connection), the last error (one line, no
secret), the attempts made, the row as the JSON that was sent, when. A delivery writes its dead letters before it
records its delivered version: one that dies in between sends those rows again next time, and a key already in
the table is not written twice.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import write_deltalake

from laminar_assets import storage

from ..delta.arrow_reads import read_arrow
from ..delta.layout import SYSTEM_FOLDER
from ..delta.tables import is_delta_table, open_delta

FOLDER = "dead_letters"
SCHEMA = pa.schema([
    ("export", pa.string()), ("source", pa.string()), ("idempotency_key", pa.string()), ("op", pa.string()),
    ("version", pa.int64()), ("partition", pa.string()), ("status", pa.int32()), ("error", pa.string()),
    ("attempts", pa.int32()), ("row", pa.string()), ("dead_at", pa.timestamp("us", tz="UTC")),
])
_CDF = {"delta.enableChangeDataFeed": "true"}  # like every table Laminar writes


def table_uri(root: str, export: str) -> str:
    return storage.join(root, SYSTEM_FOLDER, FOLDER, export)


def write(root: str, export: str, letters: list[dict]) -> int:
    """Append `letters` (dicts of SCHEMA's columns but `dead_at`) to the export's table, leaving out keys it holds
    already (a delivery that died after writing them and was run again); returns the rows written."""
    if not letters:
        return 0
    uri = table_uri(root, export)
    now = datetime.now(UTC)
    table = pa.Table.from_pylist([{**d, "dead_at": now} for d in letters], schema=SCHEMA)
    exists = is_delta_table(uri)
    if exists:
        lowest = pc.min(table.column("version")).as_py()
        held = read_arrow(uri, open_delta(uri), columns=["idempotency_key"],
                          filter=ds.field("version") >= lowest).column("idempotency_key")
        table = table.filter(pc.invert(pc.is_in(table.column("idempotency_key"), value_set=held.combine_chunks())))
        if not table.num_rows:
            return 0
    write_deltalake(uri, table, mode="append", storage_options=storage.delta_options(uri),
                    configuration=None if exists else _CDF)  # None: write_deltalake's default
    return table.num_rows


def count(root: str, export: str) -> int | None:
    """Rows in the export's dead-letter table (from the Delta log's statistics), None when it has none."""
    uri = table_uri(root, export)
    if not is_delta_table(uri):
        return None
    actions = open_delta(uri).get_add_actions(flatten=True)
    return int(sum(v for v in pa.table(actions).column("num_records").to_pylist() if v is not None))

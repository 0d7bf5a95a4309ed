"""A column a spec reads, retyped to another family since a partition's watermark: refused before
the run reads or writes anything.

The schema check (`validate.check_source`) asks Spark's analyzer whether the spec compiles against
the source as it is now, and Spark compiles a lot by implicit casts: a rule `px > 0` over a price
that became text casts every value to a number when the job runs, and fails there (or worse, reads
something else than before). The watermark's input-schema fingerprint holds only the columns the
spec names (event time, keys, aggregate columns), not those its expressions use. So before
planning, each column the spec reads (`spec.reads.columns_read`) is compared with its type at the
version each partition's watermark last read, from the Delta log (`SourceHistory.schema_at`: the
commits the run read already; an older snapshot opened only when the schema changed since). Another
type family (number, text, time, boolean, binary, or a nested type's outer kind:
`delta.schema_history.type_family`) fails the run with a `SchemaMismatchError` naming the column,
both types, the versions and the fixes. A change within a family goes on as before (SCHEMA_CHANGED,
SCHEMA_CHANGED_HISTORY), and so does a partition without a watermark, one whose watermark another
spec wrote (SPEC_CHANGED) and a forced refill: each reads the source as it is now. So does a column
restored to the family it was created with, when the one the watermark read was an interlude
(`schema_history.restored`): a partition whose first run came while the column had the other type
(it read no value needing a cast) heals when the producer restores it, instead of being refused
until a forced refill. Where the log cannot tell (cleaned up, or longer than the walk), it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from laminar_assets.checkpoints import Watermark
from laminar_assets.errors import SchemaMismatchError

from ..delta.schema_history import column_types, restored, short_type, type_family
from ..spec.reads import columns_read
from ..spec.specs import Spec
from .inputs import RunInputs


def refuse_retyped_reads(spec: Spec, marks: Mapping[str, Watermark | None], inputs: RunInputs) -> None:
    """Raise `SchemaMismatchError` if a column `spec` reads from a source now has a type of another
    family than at the version a partition's watermark last read of it (see the module)."""
    for src in spec.sources:
        info, history = inputs.infos[src], inputs.histories[src]
        if not info.delta_schema:
            continue
        now = column_types(info.delta_schema)
        reads: dict[str, str] | None = None  # parsed only when the schema changed since a watermark
        by_version: dict[int, list[str]] = {}
        for key, mark in marks.items():
            if mark is None or not mark.committed or mark.source_versions.get(src) is None \
                    or mark.spec_hash != spec.spec_hash:
                continue  # nothing read yet, or by another spec (SPEC_CHANGED): the run reads the source as it is now
            was = mark.source_ids.get(src)
            if was and info.table_id and was != info.table_id:
                continue  # another table stood there: its history says nothing (CHECKPOINT_EXPIRED)
            by_version.setdefault(mark.source_versions[src], []).append(key)
        for version, keys in sorted(by_version.items()):
            found = history.schema_at(version)
            if found is None:
                continue
            at, schema = found
            then = column_types(schema)
            reads = reads if reads is not None else columns_read(spec, src, now)
            for col, use in reads.items():
                if col not in then or type_family(then[col]) == type_family(now[col]):
                    continue
                known = {c.version: c.schema for c in history.commits}
                if at == version and restored(src, info.uri, col, at, type_family(then[col]), type_family(now[col]),
                                              known):
                    continue  # back to the type it was created with: the watermark's was an interlude
                raise _refusal(spec, src, col, use, then[col], now[col], at, version, keys, info.version)


def _refusal(spec: Spec, src: str, col: str, use: str, then: str, now: str, at: int, version: int,
             keys: list[str], latest: int) -> SchemaMismatchError:
    parts = f"partition{'s' if len(keys) > 1 else ''} {', '.join(keys)}"
    when = (f"at version {at}, the version {parts} last read" if at == version else
            f"at version {at}, the oldest the log still holds after version {version} that {parts} last read")
    return SchemaMismatchError(
        f"{spec.kind} '{spec.name}' reads column {col!r} of '{src}' ({use}), which is {short_type(now)} at version "
        f"{latest} but was {short_type(then)} {when}: a type of another family, which the spec's expressions would "
        f"read differently; nothing was read or written. Restore the column's type in '{src}' (the next run then "
        "refills over the commits written under the other type), or change the spec to read the new type (a spec "
        "change refills every partition), or, if the spec reads it correctly as it is, refill the partitions "
        "(force=True / `laminar refill`)",
        flow=spec.name, table=src, column=col, version=at, partition=keys[0])

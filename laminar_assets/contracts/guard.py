"""Source schema guard: before a run reads a source, its Delta schema is checked against its contract."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from laminar_assets.errors import SchemaMismatchError

from .model import Contract


def type_name(t: pa.DataType) -> str:
    """The contract's type name for an Arrow type (Spark SQL names)."""
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_int32(t) or pa.types.is_int16(t) or pa.types.is_int8(t):
        return "int"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return str(t)


@dataclass(frozen=True)
class GuardReport:
    table: str
    version: int
    added_columns: tuple[str, ...]


def guard_source(contract: Contract, schema: pa.Schema, version: int, used: set[str]) -> GuardReport:
    """Fail if a column the flows use is missing or has another type; report added nullable columns."""
    found = {f.name: f for f in schema}
    for name, col in contract.columns.items():
        if "*" not in used and name not in used:
            continue
        if name not in found:
            raise SchemaMismatchError(
                f"source '{contract.table}' at version {version} has no column {name!r}, which its contract "
                f"declares ({col.type}) and the flows use; found columns {sorted(found)}. Nothing was written",
                table=contract.table, column=name, version=version)
        actual = type_name(found[name].type)
        if actual != col.type:
            raise SchemaMismatchError(
                f"source '{contract.table}' column {name!r} at version {version}: expected {col.type} "
                f"(contract), found {actual}. Nothing was written", table=contract.table, column=name,
                version=version)
    added = tuple(n for n, f in found.items() if n not in contract.columns)
    for name in added:
        if not found[name].nullable:
            raise SchemaMismatchError(
                f"source '{contract.table}' at version {version} has a new non-nullable column {name!r} that its "
                "contract does not declare; add it to the contract", table=contract.table, column=name, version=version)
    return GuardReport(contract.table, version, added)

"""Loading and validating contract files; every problem names the file and the entry."""

from __future__ import annotations

import pathlib

import yaml
from pydantic import ValidationError

from laminar_assets.errors import ContractError

from .model import Contract


def load_contracts(folder: str | pathlib.Path, known_columns: dict[str, list[str]] | None = None) -> dict[str, Contract]:
    """Read every `*.yaml` in `folder`. `known_columns` (table -> columns) lets a contract naming a
    column the table does not have fail here, at definition load, instead of at run time."""
    out: dict[str, Contract] = {}
    for path in sorted(pathlib.Path(folder).glob("*.y*ml")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ContractError(f"contract {path.name} is not valid YAML: {exc}", file=str(path)) from None
        if not isinstance(data, dict):
            raise ContractError(f"contract {path.name}: expected a mapping at the top level, found {type(data).__name__}",
                                file=str(path))
        try:
            contract = Contract(**data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise ContractError(f"contract {path.name}: entry '{where}': {first['msg']}", file=str(path),
                                entry=where) from None
        contract = contract.model_copy(update={"path": str(path)})
        if contract.table in out:
            raise ContractError(f"contracts {path.name} and {pathlib.Path(out[contract.table].path).name} both describe "
                                f"table '{contract.table}'", file=str(path), entry="table")
        _check_columns(contract, path)
        if known_columns and contract.table in known_columns:
            missing = [c for c in contract.columns if c not in known_columns[contract.table]]
            if missing:
                raise ContractError(
                    f"contract {path.name}: entry 'columns.{missing[0]}': table '{contract.table}' has no column "
                    f"{missing[0]!r} (it has {', '.join(known_columns[contract.table])})",
                    file=str(path), entry=f"columns.{missing[0]}")
        out[contract.table] = contract
    return out


def _check_columns(contract: Contract, path: pathlib.Path) -> None:
    for i, rule in enumerate(contract.expectations):
        for col in rule.columns_used():
            if col not in contract.columns:
                raise ContractError(
                    f"contract {path.name}: entry 'expectations.{i}' ({rule.expect}) names column {col!r}, "
                    f"which the contract does not declare", file=str(path), entry=f"expectations.{i}")
    q = contract.quarantine
    if q is not None and q.event_time is not None and q.event_time.column not in contract.columns:
        raise ContractError(f"contract {path.name}: entry 'quarantine.event_time.column' names undeclared column "
                            f"{q.event_time.column!r}", file=str(path), entry="quarantine.event_time.column")
    for col in contract.unique_key:
        if col not in contract.columns:
            raise ContractError(f"contract {path.name}: entry 'unique_key' names undeclared column {col!r}",
                                file=str(path), entry="unique_key")

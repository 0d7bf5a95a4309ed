"""Data contracts: one YAML file per table in `data_contracts/`, the single place that says what a
table must look like. Great Expectations suites, schema guards and checks are derived from them."""

from .model import Contract, ContractColumn, ExpectationRule
from .loader import load_contracts

__all__ = ["Contract", "ContractColumn", "ExpectationRule", "load_contracts"]

"""Data contracts: one YAML file per table in `data_contracts/`, the single place that says what a
table must look like. Great Expectations suites, schema guards and checks are derived from them."""

import pathlib

from .loader import load_contracts
from .model import Contract, ContractColumn, ExpectationRule, QuarantineRules
from .rules import with_contract_rules

CONTRACTS = pathlib.Path(__file__).resolve().parents[2] / "data_contracts"  # the project's contracts

__all__ = ["CONTRACTS", "Contract", "ContractColumn", "ExpectationRule", "QuarantineRules", "load_contracts",
           "with_contract_rules"]

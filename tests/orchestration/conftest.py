"""Dagster fixtures live in tests/conftest.py (shared with the contract tests)."""

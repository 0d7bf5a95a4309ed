"""Flows and stages written in SQL: CREATE MATERIALIZED VIEW statements compiled to specs with sqlglot, and
CREATE SINK statements compiled to exports; errors name the file, line and construct."""

from .views import compile_sql, compile_sql_definitions, compile_sql_file, read_sql_file

__all__ = ["compile_sql", "compile_sql_definitions", "compile_sql_file", "read_sql_file"]

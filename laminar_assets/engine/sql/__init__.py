"""Flows and stages written in SQL: CREATE MATERIALIZED VIEW statements compiled to specs with sqlglot;
errors name the file, line and construct."""

from .views import compile_sql, compile_sql_file

__all__ = ["compile_sql", "compile_sql_file"]

"""The SQL dialect Laminar parses flows and expressions in: sqlglot's Spark dialect, plus Spark 4's
variant path extraction (`payload:price::double`, #63).

Spark 4 reads `payload:price` as `variant_get(payload, '$.price')` (a VARIANT; `::double` casts it).
sqlglot's Spark dialect does not know that syntax: it fails on `payload:price::double` and reads
`SELECT payload:price` as the alias placeholder `payload AS :price`, a silently different query. This
dialect parses the colon as a variant extraction (as sqlglot's Databricks dialect does) and writes it
back as the explicit `variant_get(payload, '$.price')`, which Spark runs with the same meaning.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.parsers.spark import SparkParser  # what Spark.Parser names (sqlglot 30 assigns it, so it is no type)


class LaminarSpark(Spark):
    """Spark SQL with `column:path` read as a variant extraction."""

    class Parser(SparkParser):
        COLON_IS_VARIANT_EXTRACT = True
        COLON_CHAIN_IS_SINGLE_EXTRACT = False

    # sqlglot 30.0 nests the generator class in Spark; later 30.x assign Spark.Generator = SparkGenerator from a
    # module 30.0 lacks, and an assigned name is no type to mypy.
    class Generator(Spark.Generator):  # type: ignore[misc,valid-type]
        TRANSFORMS = {
            **Spark.Generator.TRANSFORMS,
            exp.JSONExtract: lambda self, e: self.func(
                "variant_get" if e.args.get("variant_extract") else "GET_JSON_OBJECT", e.this, e.expression),
        }


DIALECT = LaminarSpark

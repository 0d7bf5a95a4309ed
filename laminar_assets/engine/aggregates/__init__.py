"""The aggregate algebra as Spark SQL: each aggregate's state columns, partial state, merge,
retraction and finalize (`algebra`), the internal column names (`base`), states that merge but never
retract (`sets`), and what each aggregate accepts of a column's type (`column_types`)."""

from .algebra import implementation

__all__ = ["implementation"]

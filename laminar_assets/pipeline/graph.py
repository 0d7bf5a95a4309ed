"""The shape of the pipeline: which spec produces which table, connected parts, graph order.

Pure functions over specs; the sensors use them to request one run per connected part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from laminar_assets.engine import Spec


def inputs_of(spec: Spec) -> tuple[str, ...]:
    """Every table a spec reads: its sources, and a stage's dimension tables."""
    return (*spec.sources, *spec.dimension_tables)


@dataclass(frozen=True)
class Component:
    """A connected part of the graph: specs linked by the tables they produce and read.

    `specs` are in graph order (a producer before its consumers); `external` are the tables
    no spec of the part produces (sources and dimensions), in first-use order.
    """

    name: str
    specs: tuple[Spec, ...]
    external: tuple[str, ...]

    def producer(self, table: str) -> Spec | None:
        return next((s for s in self.specs if s.sink == table), None)

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table the part reads, external ones first."""
        # a spec's sink is set (its name when none was given: Spec.__post_init__)
        produced = tuple(cast(str, s.sink) for s in self.specs if any(s.sink in inputs_of(c) for c in self.specs))
        return (*self.external, *produced)


def graph_order(specs: list[Spec]) -> list[Spec]:
    """Specs ordered so that every producer comes before the specs reading its table (stable)."""
    by_sink = {s.sink: s for s in specs}
    done: list[Spec] = []
    visiting: set[str] = set()

    def visit(spec: Spec) -> None:
        if spec in done:
            return
        if spec.name in visiting:
            raise ValueError(f"spec {spec.name!r} reads its own output through a cycle")
        visiting.add(spec.name)
        for table in inputs_of(spec):
            if table in by_sink:
                visit(by_sink[table])
        visiting.discard(spec.name)
        done.append(spec)

    for spec in specs:
        visit(spec)
    return done


def components(specs: list[Spec]) -> list[Component]:
    """The connected parts of the graph, each named after its first external table."""
    parent = {s.name: s.name for s in specs}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    readers: dict[str, list[str]] = {}
    for s in specs:
        for t in inputs_of(s):
            readers.setdefault(t, []).append(s.name)
        readers.setdefault(cast(str, s.sink), []).append(s.name)  # set by Spec.__post_init__
    for names in readers.values():
        for other in names[1:]:
            parent[find(other)] = find(names[0])
    groups: dict[str, list[Spec]] = {}
    for s in specs:
        groups.setdefault(find(s.name), []).append(s)
    out = []
    for members in groups.values():
        ordered = tuple(graph_order(members))
        produced = {s.sink for s in ordered}
        external = tuple(dict.fromkeys(t for s in ordered for t in inputs_of(s) if t not in produced))
        out.append(Component(name=external[0] if external else ordered[0].name, specs=ordered, external=external))
    return out

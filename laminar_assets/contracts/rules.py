"""Source contracts' quarantine rules, carried into the specs that read those sources."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import cast

from laminar_assets.engine import RowRule, Spec

from .model import Contract


def with_contract_rules(spec: Spec, contracts: dict[str, Contract]) -> Spec:
    """`spec` with the quarantine rules of its sources' contracts (replacing any taken from a contract
    before, so applying it twice is harmless). The rules count in the spec hash: changing one is a
    SPEC_CHANGED refill. Event-time bounds apply when the contract's column is the spec's event time."""
    own = tuple(r for r in spec.rules if r.source not in spec.sources or not _from_contract(r, contracts))
    rules, bounds = list(own), spec.event_time_bounds
    for src in spec.sources:
        q = contracts[src].quarantine if src in contracts else None
        if q is None:
            continue
        rules += [RowRule(name, check, source=src) for name, check in q.rules.items()]
        if q.event_time is not None and q.event_time.column == spec.event_time:
            lo, hi = q.event_time.not_before, q.event_time.before
            if bounds is not None:  # the spec's __post_init__ turned them into UTC datetimes
                lo, hi = max(lo, cast(datetime, bounds[0])), min(hi, cast(datetime, bounds[1]))
            bounds = (lo, hi)
    if tuple(rules) == spec.rules and bounds == spec.event_time_bounds:
        return spec
    return dataclasses.replace(spec, rules=tuple(rules), event_time_bounds=bounds)


def _from_contract(rule: RowRule, contracts: dict[str, Contract]) -> bool:
    q = contracts[rule.source].quarantine if rule.source in contracts else None
    return q is not None and q.rules.get(rule.name) == rule.check

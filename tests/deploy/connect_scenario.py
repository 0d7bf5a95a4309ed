"""Run the demo pipeline's engine paths through a Spark Connect session, in a process of its own
(a process is either local or Connect). Usage: python -m tests.deploy.connect_scenario ROOT SC_URL
Prints one JSON line with what the test asserts on; the sinks stay in ROOT for it to compare."""

from __future__ import annotations

import json
import sys

import pandas as pd
from deltalake import DeltaTable, write_deltalake


def main(root: str, url: str) -> dict:
    from laminar_assets.contracts.expectations import validate
    from laminar_assets.definitions import specs_with_contracts
    from laminar_assets.demo.generator import BatchOptions, write_batch
    from laminar_assets.engine import Engine, FlowSpec, SparkOptions, build_session
    from laminar_assets.engine.report.equivalence import check_equivalence
    from laminar_assets.engine.report.overview import explain
    from laminar_assets.flows import load_specs

    specs, contracts = specs_with_contracts(load_specs())
    spark = build_session(SparkOptions(remote=url, shuffle_partitions=2))
    engine = Engine(spark, root)
    write_batch(root, BatchOptions(rows=150, seed=5), batch=0)
    keys = ["2024-01-02-08:00", "2024-01-02-09:00", "2024-01-02-10:00", "2024-01-02-11:00"]  # hopping reach
    flows = [s for s in specs if isinstance(s, FlowSpec)]
    for spec in specs:
        engine.run_many(spec, keys)
    write_batch(root, BatchOptions(rows=40, seed=5, late_share=0.3, update_share=0.1, delete_share=0.1), batch=1)
    keys.append("2024-01-02-12:00")
    modes, quarantined = [], 0
    for spec in specs:
        for r in engine.run_many(spec, keys):
            modes.append(r.mode.value)
            quarantined += sum(r.quarantined.values())
    # late appends only (some duplicates, some breaking a rule): the stage's one-job append path
    write_batch(root, BatchOptions(rows=40, seed=6, late_share=1.0, duplicate_share=0.1, update_share=0.0,
                                   delete_share=0.0, bad_share=0.1), batch=2)
    appends = []
    for spec in specs:
        for r in engine.run_many(spec, keys):
            modes.append(r.mode.value)
            quarantined += sum(r.quarantined.values())
            if not isinstance(spec, FlowSpec):
                appends.append(f"{spec.name}/{r.mode.value}/{r.reason.value}/{r.metrics.get('rows_rejected', 0)}")
    # a kept trade sent again with an earlier time: the one-job path's observed dedup verdict refills
    kept = DeltaTable(f"{root}/normalized_trades").to_pandas()
    trade = kept[kept["event_time"].dt.minute >= 1].iloc[0]["trade_id"]
    raw = DeltaTable(f"{root}/raw_trades").to_pandas()
    again = raw[raw["trade_id"] == trade].head(1).reset_index(drop=True)
    again["event_time"] = again["event_time"] - pd.Timedelta(seconds=30)
    write_deltalake(f"{root}/raw_trades", again, mode="append")
    for spec in specs:
        for r in engine.run_many(spec, keys):
            modes.append(r.mode.value)
            if not isinstance(spec, FlowSpec) and r.mode.value != "NOOP":
                appends.append(f"{spec.name}/{r.mode.value}/{r.reason.value}/{r.metrics.get('rows_rejected', 0)}")
    equivalence = {f.name: check_equivalence(engine, f, "2024-01-02-09:00", sample=6).passed for f in flows}
    # Both Great Expectations engines over Connect: Spark's (local_rows=0) and pandas' (rows via Arrow).
    contract = {f"{s.name}/{engine_name}": validate(engine.sink_frame(s, "2024-01-02-10:00"), contracts[s.sink],
                                                     local_rows=limit).success
                for s in specs if s.sink in contracts for engine_name, limit in (("spark", 0), ("pandas", 10**6))}
    physical = explain(engine, flows[-1], "2024-01-02-10:00")["physical"]
    return {"session": type(spark).__module__, "modes": modes, "quarantined": quarantined, "stage_appends": appends,
            "quarantine_table": DeltaTable.is_deltatable(f"{root}/_laminar/quarantine/raw_trades"),
            "equivalence": equivalence, "contract": contract, "physical": physical,
            "vectors": vectors_and_mapping(engine, root)}


VECTOR_FLOWS = {"dv_sum": ("count", "sum"), "dv_distinct": ("count", "distinct")}


def vector_flow(name: str):
    from laminar_assets.engine import Agg, FlowSpec, Tumbling

    aggs = {"count": Agg.count(), "sum": Agg.sum("px"), "distinct": Agg.count_distinct("px")}  # the last cannot retract
    return FlowSpec(name=name, source="dv_trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=tuple(aggs[k] for k in VECTOR_FLOWS[name]))


def vectors_and_mapping(engine, root: str) -> list[str]:
    """A column-mapped source with deletion vectors: snapshot reads drop deleted rows by position
    and vector commits are read as signed changes (arrow frames sent over Connect)."""
    import pyarrow.compute as pc
    from deltalake import write_deltalake

    from tests.conftest import trades_frame
    from tests.delta_features import delete_where, enable_deletion_vectors

    path = f"{root}/dv_trades"
    rows = [(f"2024-01-01 00:{m:02d}:00", "ab"[m % 2], float(m), m % 4) for m in range(60)]
    write_deltalake(path, trades_frame(rows), configuration={"delta.columnMapping.mode": "name"})
    enable_deletion_vectors(path)
    names = {f.name: f.metadata["delta.columnMapping.physicalName"] for f in DeltaTable(path).schema().fields}
    reasons = []
    delete_where(path, lambda t: pc.equal(t["qty"], 1), column_names=names)
    for name in VECTOR_FLOWS:  # first run: a snapshot read with a deletion vector
        reasons += [r.reason.value for r in engine.run_many(vector_flow(name), ["2024-01-01-00:00"])]
    write_deltalake(path, trades_frame([("2024-01-01 00:30:30", "a", 100.0, 2)]), mode="append")
    delete_where(path, lambda t: pc.greater(t["px"], 50.0), column_names=names)
    for name in VECTOR_FLOWS:  # the commits: an append and a vector change on two files
        reasons += [r.reason.value for r in engine.run_many(vector_flow(name), ["2024-01-01-00:00"])]
    return reasons


if __name__ == "__main__":
    from laminar_assets.process_exit import run_then_exit

    # the test asserts exit code 0: the process's own, not an abort of the teardown after deltalake's reads
    # (docs/known-limits.md, "Exit codes")
    run_then_exit(lambda: print(json.dumps(main(sys.argv[1], sys.argv[2]))))

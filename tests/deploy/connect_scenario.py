"""Run the demo pipeline's engine paths through a Spark Connect session, in a process of its own
(a process is either local or Connect). Usage: python -m tests.deploy.connect_scenario ROOT SC_URL
Prints one JSON line with what the test asserts on; the sinks stay in ROOT for it to compare."""

from __future__ import annotations

import json
import sys

from deltalake import DeltaTable


def main(root: str, url: str) -> dict:
    from laminar_assets.contracts.expectations import validate
    from laminar_assets.definitions import specs_with_contracts
    from laminar_assets.demo.generator import BatchOptions, write_batch
    from laminar_assets.engine import Engine, FlowSpec, SparkOptions, build_session
    from laminar_assets.engine.equivalence import check_equivalence
    from laminar_assets.engine.report import explain
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
    equivalence = {f.name: check_equivalence(engine, f, "2024-01-02-09:00", sample=6).passed for f in flows}
    contract = {s.name: validate(engine.sink_frame(s, "2024-01-02-10:00"), contracts[s.sink]).success
                for s in specs if s.sink in contracts}
    physical = explain(engine, flows[-1], "2024-01-02-10:00")["physical"]
    return {"session": type(spark).__module__, "modes": modes, "quarantined": quarantined,
            "quarantine_table": DeltaTable.is_deltatable(f"{root}/_laminar/quarantine/raw_trades"),
            "equivalence": equivalence, "contract": contract, "physical": physical}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))

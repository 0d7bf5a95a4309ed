"""Object-store requests of ONE Dagster step (vwap_1m, one partition) and its checks in a new process, the lake in a
bucket of the local S3 server: what a run the daemon launches costs on a store, by the function that made each request.

    .venv/bin/python -m bench.step_requests    (STEPREQ_ROUNDS=N, default 5; STEPREQ_FLOW: vwap_1m or normalized_trades)
  STEPREQ_ROUNDS: source commits (each followed by a stage run and, but the last, a flow run) before the measured
  run, so the tables' logs hold about N+1 commits. Result: bench/results/step_requests.json (the totals per step,
  the requests by function) and the request sequence printed.

Parent: starts moto (tests.object_store.start_moto), makes a bucket, runs two child processes:
  setup  - sources (raw_trades, symbols), materializes normalized_trades + vwap_1m (+ checks) for P9,
           appends a trade to raw_trades, materializes normalized_trades for P9 again (vwap_1m now has work)
  step   - a NEW process (as the daemon's run worker): loads the definitions (build_definitions), and
           materializes vwap_1m + its contract and equivalence checks for P9 (what a sensor run carries),
           recording every S3 request; each Dagster step and each function of interest marks its start
           and end in the recording (RequestLog.mark), nested ("step > fn > fn").
Both children reach the bucket only through LAMINAR_ROOT and the AWS_* variables, as a deployment does.
Output: /tmp/stepreq/out/requests.json and the tables printed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

OUT = os.environ.get("STEPREQ_WORK") or tempfile.mkdtemp(prefix="laminar-step-requests-")
P9 = "2024-01-02-09:00"
FLOW = os.environ.get("STEPREQ_FLOW", "vwap_1m")
RESULT = os.path.join(REPO, "bench", "results",
                      "step_requests.json" if FLOW == "vwap_1m" else f"step_requests_{FLOW}.json")
SPECS = ("normalized_trades", "vwap_1m")
STAGE = "normalized_trades"  # STEPREQ_FLOW=normalized_trades: the stage's step (and its contract check) instead
CHECKS = ("contract",) if FLOW == STAGE else ("contract", "equivalence")


def _settings():
    from laminar_assets.pipeline.settings import load_settings

    return load_settings().model_copy(update={"partitions_start": datetime(2024, 1, 1, tzinfo=UTC)})


def _definitions():
    from laminar_assets.flows import load_specs
    from laminar_assets.orchestration.builder import build_definitions

    specs = [s for s in load_specs() if s.name in SPECS]
    return build_definitions(specs, _settings())


def _materialize(defs, instance, selection):
    import dagster as dg

    from laminar_assets.resources import LaminarResource, SparkResource

    # the resource the definitions default to (root and store from LAMINAR_ROOT and AWS_*); stop_at_end False
    # only so that the setup child keeps one JVM for its runs
    laminar = LaminarResource(spark=SparkResource(stop_at_end=False))
    return dg.materialize([*defs.assets, *defs.asset_checks], selection=selection, partition_key=P9,
                          instance=instance, resources={"laminar": laminar})


def _with_checks(name, *checks):
    import dagster as dg

    sel = dg.AssetSelection.assets(name).without_checks()
    for c in checks:
        sel = sel | dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey(name), c))
    return sel


def setup(root: str, endpoint: str) -> None:
    import dagster as dg

    from laminar_assets import storage
    from laminar_assets.deploy.local_s3 import KEY, SECRET
    from laminar_assets.storage import ObjectStoreOptions
    from tests.conftest import Lake
    from tests.orchestration.pipeline import BASE, create_sources, trades

    opts = ObjectStoreOptions(endpoint=endpoint, region="us-east-1", access_key_id=KEY, secret_access_key=SECRET,
                              path_style=True)
    with storage.mounted("s3://", opts), dg.instance_for_test(temp_dir=tempfile.mkdtemp(dir=OUT)) as instance:
        lake = Lake(root)
        create_sources(lake, BASE)
        defs = _definitions()
        for sel in (_with_checks("normalized_trades", "contract"), _with_checks("vwap_1m", "contract", "equivalence")):
            r = _materialize(defs, instance, sel)
            assert r.success
        rounds = int(os.environ.get("STEPREQ_ROUNDS", "5"))  # commits made to every table before the measured run
        for i in range(rounds):
            lake.append("raw_trades", frame=trades([(5 + i, f"2024-01-02 09:{1 + i:02d}:30", "AAPL", "ACC-9", "BUY",
                                                     189.0 + i, 100)]))
            if FLOW == STAGE and i == rounds - 1:  # the measured run is the stage's: it has the last append to do
                break
            assert _materialize(defs, instance, _with_checks("normalized_trades", "contract")).success
            if i < rounds - 1:  # the last round leaves vwap_1m behind: the measured run has work
                assert _materialize(defs, instance, _with_checks("vwap_1m", "contract", "equivalence")).success
    print("setup done", flush=True)


# --- the step child: marks -------------------------------------------------------------------------------------

def _targets():
    """(owner, attribute, label) of every function whose requests are told apart."""
    import laminar_assets.contracts.expectations as expectations
    import laminar_assets.engine.report as report
    import laminar_assets.engine.report.equivalence as equivalence
    import laminar_assets.engine.report.sink_read as sink_read
    import laminar_assets.orchestration.assets as assets
    import laminar_assets.orchestration.checks as checks
    import laminar_assets.orchestration.table_metadata as table_metadata
    from bench.request_log import _steps
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.engine import executor
    from laminar_assets.resources import LaminarResource, SparkResource

    E = executor.Engine
    out = [(o, a, label) for label, o, a in _steps()]
    out += [
        (E, "__init__", "Engine()"), (E, "run_many", "run_many"), (E, "integrity", "Engine.integrity"),
        (E, "sink_tables", "Engine.sink_tables"), (E, "sink_frames", "Engine.sink_frames"),
        (E, "preview", "Engine.preview"),
        (assets, "warm_up", "warm_up"), (assets, "_guard_sources", "_guard_sources"),
        (assets, "table_metadata", "table_metadata"), (assets, "recent_rates", "recent_rates"),
        (assets, "_preview", "_preview"),
        (table_metadata, "table_info", "table_info"), (table_metadata, "snapshot_files", "snapshot_files"),
        (LaminarResource, "engine", "LaminarResource.engine"),
        (LaminarResource, "resolved_root", "resolved_root"),
        (SparkResource, "get_session", "spark session"),
        (checks, "evaluate_range", "evaluate_range"), (checks, "broken_tables", "broken_tables"),
        (checks, "contract_outcomes", "contract_outcomes"), (checks, "_spark_outcomes", "_spark_outcomes"),
        (checks, "equivalence_outcomes", "equivalence_outcomes"),
        (report, "check_equivalence_many", "check_equivalence_many"),
        (equivalence, "_chosen_windows", "_chosen_windows"), (equivalence, "_sink_window_starts", "_sink_window_starts"),
        (equivalence, "state_query", "state_query"), (equivalence, "read_set", "read_set"),
        (equivalence, "_compare_in_driver", "_compare_in_driver"), (equivalence, "_compare_in_spark", "_compare_in_spark"),
        (sink_read, "read_in_driver", "read_in_driver"),
        (expectations, "validate_local", "validate_local"), (expectations, "fetch_local", "fetch_local"),
        (CheckpointStore, "load", "CheckpointStore.load"),
        (executor.unchanged, "check", "unchanged.check"), (E, "_checked_sink", "check_sink"),
        (E, "_reach_sources", "_reach_sources"),
    ]
    return out


def step(root: str, endpoint: str) -> None:
    from unittest import mock

    import dagster as dg

    from bench.request_log import RequestLog

    log = RequestLog(endpoint, sinks=(FLOW,))
    stack: list[str] = []
    times: list[tuple[str, float]] = []

    def here() -> str:
        return " > ".join(stack) or "(outside any step)"

    def enter(label):
        stack.append(label)
        log.mark(here())
        times.append((here(), time.perf_counter()))

    def leave():
        times.append(("<" + here(), time.perf_counter()))
        stack.pop()
        log.mark(here())

    def wrap(label, fn, is_cm=False):
        if is_cm:
            @contextlib.contextmanager
            def cm(*a, **kw):
                enter(label)
                with fn(*a, **kw):
                    leave()
                    try:
                        yield
                    finally:
                        enter(label)
                leave()
            return cm

        @functools.wraps(fn)
        def w(*a, **kw):
            enter(label)
            try:
                return fn(*a, **kw)
            finally:
                leave()
        return w

    # each Dagster step marks itself: wrap the asset's and the checks' functions as the builder decorates them
    orig_asset, orig_check = dg.asset, dg.asset_check

    def asset(*a, **kw):
        deco = orig_asset(*a, **kw)
        return lambda fn: deco(wrap(f"STEP {kw.get('name')}", fn))

    def asset_check(*a, **kw):
        deco = orig_check(*a, **kw)
        return lambda fn: deco(wrap(f"STEP {kw['asset'].to_user_string()}:{kw.get('name')}", fn))

    log.start()
    enter("load definitions")
    with mock.patch.object(dg, "asset", asset), mock.patch.object(dg, "asset_check", asset_check):
        defs = _definitions()
    leave()
    with contextlib.ExitStack() as patches:
        for owner, attr, label in _targets():
            patches.enter_context(mock.patch.object(owner, attr, wrap(label, getattr(owner, attr),
                                                                      is_cm=attr == "scope")))
        with dg.instance_for_test(temp_dir=tempfile.mkdtemp(dir=OUT)) as instance:
            t0 = time.perf_counter()
            result = _materialize(defs, instance, _with_checks(FLOW, *CHECKS))
            wall = time.perf_counter() - t0
    requests = log.requests()
    assert result.success
    mats = result.asset_materializations_for_node(FLOW)
    md = mats[0].metadata
    evals = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    rows = [dict(phase=r.phase, kind=r.kind, object=r.object, client=r.client, key=r.key) for r in requests]
    with open(os.path.join(OUT, f"requests_{FLOW}_{os.environ.get('STEPREQ_ROUNDS', '5')}.json"), "w") as fh:
        json.dump({"mode": md["mode"].value, "reason": md["reason"].value, "checks": evals, "wall_s": wall,
                   "times": times, "requests": rows}, fh)
    print("step done", md["mode"].value, md["reason"].value, evals, flush=True)


# --- the parent ------------------------------------------------------------------------------------------------

def render(path: str) -> None:
    data = json.load(open(path))
    reqs = data["requests"]
    print(f"run: {FLOW} {P9} -> {data['mode']} ({data['reason']}); checks {data['checks']}; "
          f"{len(reqs)} requests; dg.materialize wall {data['wall_s']:.1f}s (no latency)")

    def step_of(phase):
        return phase.split(" > ")[0]

    print("\n== per top-level phase (Dagster step) ==")
    for s, n in Counter(step_of(r["phase"]) for r in reqs).most_common():
        inside = sum(1 for r in reqs if step_of(r["phase"]) == s and "run_many" in r["phase"])
        print(f"{n:5d}  {s}   (inside run_many: {inside})")
    print("\n== per (phase path, object, kind, client) ==")
    rows = Counter((r["phase"], r["object"], r["kind"], r["client"]) for r in reqs)
    for (ph, ob, k, c), n in sorted(rows.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:4d}  {k:5s} {c:9s} {ob:16s} {ph}")
    print("\n== request sequence (phase changes) ==")
    last = None
    for r in reqs:
        tag = (r["phase"])
        if tag != last:
            print(f"-- {tag}")
            last = tag
        print(f"     {r['kind']:5s} {r['client']:9s} {r['object']:16s} {r['key'][-90:]}")


def _summarize(path: str) -> None:
    """bench/results/step_requests.json: the totals per Dagster step and the requests by function."""
    import subprocess as sp

    data = json.load(open(path))
    reqs = data["requests"]
    steps = Counter(r["phase"].split(" > ")[0] for r in reqs)
    inside = Counter(r["phase"].split(" > ")[0] for r in reqs if "run_many" in r["phase"])
    by_function = Counter(f"{r['phase']} | {r['object']} | {r['kind']} | {r['client']}" for r in reqs)
    code = sp.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), "code": code, "flow": FLOW, "partition": P9,
           "rounds": int(os.environ.get("STEPREQ_ROUNDS", "5")), "mode": data["mode"], "reason": data["reason"],
           "checks": data["checks"], "requests": len(reqs),
           "steps": {s: {"requests": n, "in_run_many": inside.get(s, 0)} for s, n in steps.most_common()},
           "by_function": dict(by_function.most_common())}
    with open(RESULT, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    if len(sys.argv) > 1 and sys.argv[1] == "render":
        render(os.path.join(OUT, f"requests_{FLOW}_{os.environ.get('STEPREQ_ROUNDS', '5')}.json"))
        return
    from tests.object_store import start_moto

    server = start_moto()
    try:
        root = server.bucket("lake")
        work = tempfile.mkdtemp(prefix="work-", dir=OUT)  # the children's cwd: Spark's files go there
        env = {**os.environ, **server.options.as_env(), "LAMINAR_ROOT": root, "PYTHONPATH": REPO,
               "LAMINAR_SPARK_MASTER": "local[2]", "LAMINAR_SPARK_JIT": "quick", "DAGSTER_HOME": work}
        env.pop("LAMINAR_SPARK_REMOTE", None)
        env["STEPREQ_WORK"] = OUT
        for mode in ("setup", "step"):
            subprocess.run([sys.executable, __file__, mode, root, server.endpoint], env=env, cwd=work, check=True)
        path = os.path.join(OUT, f"requests_{FLOW}_{os.environ.get('STEPREQ_ROUNDS', '5')}.json")
        _summarize(path)
        render(path)
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("setup", "step"):
        {"setup": setup, "step": step}[sys.argv[1]](sys.argv[2], sys.argv[3])
    else:
        main()

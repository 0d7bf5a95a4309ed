"""`make soak`: the random stateful test (tests/engine/stateful_lake.py) for as long as you give it.

    python -m tests.soak --seconds 3600 --seed 1          # runs seeds 1, 2, 3, ... until the hour is up
    python -m tests.soak --seed 17 --examples 50          # one seed again: the same histories
    python -m tests.soak --reproduce "AXicY2BkYGBgYGRg..."  # one failing history, exactly

Each seed runs `--examples` random histories of up to `--steps` steps. Any failure stops the soak,
prints Hypothesis's smallest failing history and one line that reproduces it. The histories export some
specs to a Postgres and a Redis server and a webhook receiver the soak starts (127.0.0.1 / a Unix socket,
stopped at its end, also on failure); `--no-exports` leaves them out.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from hypothesis import HealthCheck, Phase, reproduce_failure, seed, settings
from hypothesis.stateful import get_state_machine_test

from laminar_assets.engine import SparkOptions, build_session
from tests.engine.stateful_lake import LakeMachine


def _test(examples: int, steps: int, *, shrink: bool = True):
    phases = list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    return get_state_machine_test(LakeMachine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck), print_blob=True, phases=phases))


def _blob(exc: BaseException) -> str | None:
    notes = "\n".join(getattr(exc, "__notes__", []) + [str(exc)])
    for sub in getattr(exc, "exceptions", ()):  # several distinct failures: the first one's
        notes += "\n" + "\n".join(getattr(sub, "__notes__", []))
    found = re.search(r"reproduce_failure\('[^']+', b'([^']+)'\)", notes)
    return found.group(1) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0,
                        help="time budget: no new seed starts after it (0: the first seed only)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000, help="first seed")
    parser.add_argument("--examples", type=int, default=25, help="histories per seed")
    parser.add_argument("--steps", type=int, default=14, help="steps per history at most")
    parser.add_argument("--reproduce", help="the blob a failure printed: run that one history")
    parser.add_argument("--no-exports", action="store_true",
                        help="no Postgres, Redis and webhook exports in the histories")
    args = parser.parse_args(argv)

    LakeMachine.spark = build_session(SparkOptions(master="local[2]", shuffle_partitions=2, driver_memory="2g"))
    servers = []
    try:
        if not args.no_exports:
            from tests.engine.export.receiver import Receiver
            from tests.postgres import start_postgres
            from tests.redis_server import start_redis

            servers.append(start_postgres())
            servers.append(start_redis())
            servers.append(Receiver())
            LakeMachine.pg_server, LakeMachine.redis_server, LakeMachine.webhook_receiver = servers
        return _soak(args)
    finally:
        for server in servers:
            server.stop()


def _soak(args) -> int:
    if args.reproduce:
        import hypothesis

        test = _test(1, args.steps)
        reproduce_failure(hypothesis.__version__, args.reproduce.encode())(test)
        test()
        print("the history passed")
        return 0
    started, current, histories = time.monotonic(), args.seed, 0
    while True:
        test = _test(args.examples, args.steps)
        seed(current)(test)
        try:
            test()
        except Exception as exc:  # noqa: BLE001  (any failure of the tested code is the finding)
            blob = _blob(exc)
            print(f"\nsoak: seed {current} failed after {histories} passing histories "
                  f"({time.monotonic() - started:.0f} s): {type(exc).__name__}", file=sys.stderr)
            print(f"reproduce: make soak SOAK_ARGS='--seed {current} --examples {args.examples} --steps {args.steps} "
                  f"--seconds 0'" + (f"   or exactly: make soak SOAK_ARGS='--reproduce {blob} --steps {args.steps}'"
                                    if blob else ""), file=sys.stderr)
            raise
        histories += args.examples
        print(f"soak: seed {current}: {args.examples} histories passed ({histories} in "
              f"{time.monotonic() - started:.0f} s)", flush=True)
        current += 1
        if time.monotonic() - started >= args.seconds:
            break
    print(f"soak: {histories} histories of up to {args.steps} steps passed, seeds {args.seed}..{current - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

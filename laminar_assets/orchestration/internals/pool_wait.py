"""What a run does while its steps wait for a concurrency pool slot another run holds.

Dagster's own loop retries the claim, but says nothing past one engine event, waits forever, and
(1.13) spins while it waits: its `sleep_til_ready` sleeps for the time to the next claim check,
computed as `min(0, ...)`, so never. The thread executor asks a `PoolWaiter` instead, every time
its loop comes round while a step waits (it sleeps between rounds), and the waiter, at most once
per `CHECK_SECONDS`:

- frees the slots of holders that cannot be using them: a run whose process is gone is failed
  and its slots freed (run_processes.py), so a killed run never wedges its assets;
- says which run holds the slot (id, start, pid, alive or not) when that changes, and which runs
  it failed: to the run's log, and to the `notify` of the run's policy (the CLI prints it);
- gives up after the policy's `seconds` with a `ConcurrentRunError` naming the holder. The policy
  is set by whoever executes the run in this process (`in_process.execute_job_here`: the CLI's
  `--wait-seconds`); a run the daemon launched waits as long as it takes, as Dagster's runs do.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dagster as dg

from laminar_assets.errors import ConcurrentRunError
from laminar_assets.orchestration.internals.run_processes import pool_holders, release_dead_holder

CHECK_SECONDS = 1.0
"""How often a waiting run looks at who holds its pools (each look is a few small instance queries)."""

SLEEP_SECONDS = 0.25
"""How long the executor's loop sleeps between rounds while steps wait for slots and none runs."""


@dataclass(frozen=True)
class PoolWaitPolicy:
    """How a run executed in this process waits for pool slots."""

    seconds: float | None = None  # give up after this long; None: wait as long as it takes
    notify: Callable[[str], None] | None = None  # hears what the run waits for (when that changes), and
    # which runs it failed because their process was gone


WAIT_AS_LONG_AS_IT_TAKES = PoolWaitPolicy()  # Dagster's own behaviour: runs the daemon launched
_POLICY: contextvars.ContextVar[PoolWaitPolicy | None] = contextvars.ContextVar("laminar_pool_wait", default=None)


@contextmanager
def pool_wait_policy(policy: PoolWaitPolicy) -> Iterator[None]:
    """Runs executed in this thread inside the block wait for pool slots as `policy` says."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


class PoolWaiter:
    """The waiting of one run, as its executor's loop sees it round after round."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str, log: Callable[[str], None]) -> None:
        self.instance = instance
        self.run_id = run_id
        self.log = log
        self.policy = _POLICY.get() or WAIT_AS_LONG_AS_IT_TAKES
        self.since: float | None = None  # when the current wait began
        self.checked = 0.0
        self.said = ""

    def check(self, pools: Iterable[str]) -> None:
        """One round: `pools` are the pools the run's waiting steps need (empty: nothing waits)."""
        pools = sorted({p for p in pools if p})
        now = time.monotonic()
        if not pools:
            self.since = None
            return
        if self.since is None:
            self.since = now
        if now - self.checked < CHECK_SECONDS:
            return
        self.checked = now
        waits = []
        for pool in pools:
            holders = []
            for holder in pool_holders(self.instance, pool, other_than=self.run_id):
                note = release_dead_holder(self.instance, holder)
                if note:
                    self._say(note)
                else:
                    holders.append(holder)
            claimed = [h for h in holders if h.claimed]
            if claimed:
                waits.append(f"pool {pool} is held by {'; '.join(h.describe() for h in claimed)}")
            elif holders:
                waits.append(f"pool {pool}: queued behind {'; '.join(h.describe() for h in holders)}")
        said = "; ".join(waits)
        if said and said != self.said:
            self.said = said
            self._say(f"waiting: {said}")
        limit = self.policy.seconds
        if limit is not None and now - self.since >= limit and said:
            raise ConcurrentRunError(
                f"gave up after waiting {now - self.since:.0f} s for a concurrency slot (one run of an asset "
                f"at a time): {said}. Let that run finish and try again, stop its process, or terminate it in "
                "the Dagster UI; `laminar refill --wait-seconds` sets how long to wait")

    def _say(self, text: str) -> None:
        self.log(text)
        if self.policy.notify is not None:
            self.policy.notify(text)

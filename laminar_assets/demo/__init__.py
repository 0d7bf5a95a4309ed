"""The demo: a deterministic trades generator and the end-to-end run the CLI drives."""

# The demo's JVM lives for one short run over a few thousand rows: compiling with C1 only leaves the
# CPU to the work (2 cores: the demo in ~28 s instead of ~35 s; `SparkOptions.jit`). Here, not in
# `run`, so the CLI can start that JVM before it imports Dagster (the session is ready ~0.5 s sooner).
DEMO_JIT = "quick"

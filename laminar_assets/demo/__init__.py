"""The demo: a deterministic trades generator and the end-to-end run the CLI drives."""

# The demo's JVM lives for one short run over a few thousand rows: compiling with C1 only leaves the
# CPU to the work (`SparkOptions.jit`). Here, not in `run`, so the CLI can start that JVM before it
# imports Dagster (the session is ready sooner).
DEMO_JIT = "quick"

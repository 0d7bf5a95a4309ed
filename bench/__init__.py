"""Laminar's benchmark harness: incremental vs refill vs full recompute vs Spark Structured Streaming,
scaling with table size, and end-to-end freshness through Dagster.

Run it with `make bench` (full profile) or `make bench-smoke` (tiny sizes); see bench/README.md.
A benchmark, not a test: it reports numbers and never fails on speed, only on wrong answers.
"""

"""The demo: a deterministic trades generator and the end-to-end run the CLI drives."""

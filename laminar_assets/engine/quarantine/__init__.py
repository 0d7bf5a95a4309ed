"""Rows that broke a rule, kept per source with the rule, the source version and the row itself
(`records`); the sweep of rows no partition owns is a step of every run (`run.sweep`)."""

from .records import summarize

__all__ = ["summarize"]

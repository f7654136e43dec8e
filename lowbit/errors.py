"""Errors lowbit raises for a user's mistake (as opposed to a bug): the command line prints them as one
line and exits with status 2."""

from __future__ import annotations


class UsageError(ValueError):
    """A user's input that cannot work, with what to do instead (one line)."""

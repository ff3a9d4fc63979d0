"""The one error every ``ferryctl`` subcommand raises for a missing or contradictory argument (exit 2)."""

from __future__ import annotations


class UsageError(Exception):
    """A missing or contradictory argument: ``ferryctl`` prints it and exits 2."""

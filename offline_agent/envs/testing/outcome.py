"""What a check-env check returns or raises: its own module, so that check.py (which runs the
checks) and the modules of further checks (grammar_check.py) both import it, not each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckResult:
    name: str
    ok: bool | None  # None: skipped, the check does not apply to this env
    detail: str


class CheckFailed(Exception):
    """A contract violation found by a check; its message is the detail shown."""


class CheckSkipped(Exception):
    """The check does not apply to this env; its message says why."""

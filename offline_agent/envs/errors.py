"""What an env raises, and how model text is echoed back in its messages.

Its own module so that the parser and the Env contract (base.py, which parses through the
parser) both import it, and neither imports the other's importer.
"""

from __future__ import annotations

ECHO_CHARS = 40  # names and keys from model text are cut to this in error observations


class ActionError(ValueError):
    """Raised by parsers/validators; `act` turns it into an invalid step, never a crash."""


class NoToolCall(ActionError):
    """A reply that calls no tool (empty, or prose): an invalid step for most envs, the end of
    the episode for a TRL-shaped env, as under TRL (envs/trl/env.py)."""


class EnvFailure(RuntimeError):
    """The env's own machinery failed (e.g. its sandbox cannot run): not the model's fault,
    so `act` raises it instead of recording an invalid step."""


def short(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters, for echoing model text back in an observation."""
    return text if len(text) <= limit else text[: limit - 3] + "..."

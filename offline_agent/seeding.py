"""The one seeding helper: seeds derived from names, the same in every process and Python."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: int | str) -> int:
    """A 63-bit seed from `parts` (ints and strings), via sha256 of their `/`-joined text.

    Unlike `hash()` it does not depend on the Python version or PYTHONHASHSEED, and a seed
    named by what it is for (task, simulation, turn) does not depend on what else shares a
    batch, so a resumed or re-batched run samples what the first one did.
    """
    for part in parts:
        if not isinstance(part, (int, str)) or isinstance(part, bool):
            raise TypeError(f"stable_seed takes ints and strings, got {type(part).__name__}")
    text = "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1

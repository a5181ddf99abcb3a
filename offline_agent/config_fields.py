"""The field of every config section: its default, the help line `--help` prints, and whether
it enters the hash that decides if a stage's stored results still match the config.

One definition for the library's sections (search, mine, train, eval) and the pipeline's
(pipelines/config.py), which all write `config_field(default, help)`.
"""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any

HELP = "help"  # metadata key of a field's help line
HASHED = "hashed"  # metadata key: False leaves the field out of stage hashes


def config_field(default: Any, help: str, hashed: bool = True) -> Any:
    """A dataclass field with `default` and its `help`. `hashed=False` for a key that says how
    or where work runs, not what it computes (renaming a run or sharding a search must not
    invalidate finished stages)."""
    return field(default=default, metadata={HELP: help, HASHED: hashed})


def is_hashed(f: Field) -> bool:
    """Whether a field enters stage hashes (fields built without config_field do)."""
    return f.metadata.get(HASHED, True)

"""Env state <-> plain JSON data: snapshots are data that loading can never turn into code.

Snapshots land in the run's DuckDB file, travel between machines (`merge` of shard stores)
and are read back on resume, so they hold only what Python's json module writes: dicts with
string keys, lists, strings, numbers, booleans and None. A dataclass is written as a dict of
its fields and rebuilt from the fields' type hints, so a tuple comes back a tuple (MiniShop
seeds its hindsight goal with the repr of a tuple field); any other state must be JSON data
already. `difference` names the first field that does not come back as it went in.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

_SCALARS = frozenset({str, int, float, bool, type(None)})


class StateError(TypeError):
    """A state that cannot be written as JSON data, or that does not come back the same."""


def encode(value: Any, path: str = "state") -> Any:
    """`value` as JSON data; dataclasses become dicts of their fields, tuples lists."""
    if type(value) in _SCALARS or isinstance(value, str | int | float):  # bool is an int
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: encode(getattr(value, name), f"{path}.{name}")
                for name in _field_names(type(value))}
    if isinstance(value, list | tuple):
        return [encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise StateError(f"{path} has the key {key!r}, and JSON keys are strings")
        return {k: encode(v, f"{path}[{k!r}]") for k, v in value.items()}
    raise StateError(f"{path} holds a {type(value).__name__}, which is not JSON data")


def decode(hint: Any, data: Any) -> Any:
    """A value of type `hint` rebuilt from JSON data, sharing no container with `data`."""
    if data is None:
        return None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(data, dict):
            raise StateError(f"{hint.__name__} needs a JSON object, got {type(data).__name__}")
        return hint(**{name: decode(kind, data[name])
                       for name, kind in _init_fields(hint) if name in data})
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return decode(options[0] if len(options) == 1 else Any, data)
    if origin in (tuple, list) and isinstance(data, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return tuple(decode(a, v) for a, v in zip(args, data, strict=True))
        items = [decode(args[0] if args else Any, v) for v in data]
        return tuple(items) if origin is tuple else items
    if origin is dict and isinstance(data, dict):
        return {k: decode(args[1] if args else Any, v) for k, v in data.items()}
    return _copy(data)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _init_fields(cls: type) -> list[tuple[str, Any]]:
    """(name, type hint) of a dataclass's init fields; resolving hints is slow, so once."""
    try:
        hints = typing.get_type_hints(cls)
    except NameError as e:
        raise StateError(f"{cls.__name__}'s field types cannot be resolved: {e}") from None
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _copy(data: Any) -> Any:
    if isinstance(data, list):
        return [_copy(v) for v in data]
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    return data


def difference(before: Any, after: Any, path: str = "state") -> str | None:
    """Where `after` (a round-tripped value) differs from `before`, as one line; None if equal."""
    if type(before) is not type(after):
        return f"{path} is a {type(before).__name__} and comes back a {type(after).__name__}"
    if type(before) in _SCALARS and before == after:
        return None
    if dataclasses.is_dataclass(before):
        pairs = [(f".{name}", getattr(before, name), getattr(after, name))
                 for name in _field_names(type(before))]
    elif isinstance(before, list | tuple) and len(before) == len(after):
        pairs = [(f"[{i}]", b, a) for i, (b, a) in enumerate(zip(before, after))]
    elif isinstance(before, dict) and before.keys() == after.keys():
        pairs = [(f"[{k!r}]", before[k], after[k]) for k in before]
    elif isinstance(before, float) and math.isnan(before) and math.isnan(after):
        return None
    else:
        return None if before == after else f"{path} is {before!r} and comes back {after!r}"
    for step, b, a in pairs:
        found = difference(b, a, path + step)
        if found:
            return found
    return None

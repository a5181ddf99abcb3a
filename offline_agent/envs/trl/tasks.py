"""A TRL dataset -> the env's tasks: one task per row, in the file's order.

The path is read as `datasets` reads it: a JSONL/JSON, CSV, parquet or arrow file, a folder of
data files (`load_dataset(folder)`; its split files name the rows' splits), or a folder written
by `save_to_disk` (`load_from_disk`). A row's `prompt` (a string, or a list of messages whose
texts are joined) is the task's instruction; the whole row is `Task.data`, what `reset(**row)`
receives, as TRL passes every column. A row's split is its `split` column (train, val or test)
where present, else its data file's split, else a seeded hash of the row (1 in 5 is test), so
no row is in two splits. Validation rows follow the train rows in the train split: with
`env.train_tasks` set to the number of train rows, `env.val_tasks` takes them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from offline_agent.envs import state_json
from offline_agent.types import Task

SPLITS = {"train": "train", "val": "val", "validation": "val", "test": "test"}
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet",
             ".arrow": "arrow"}


class DatasetError(ValueError):
    """A dataset that cannot be the env's tasks: one line that names the row and column."""


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of the dataset at `path`, each with its data file's split under `split` where
    the folder had several and the row names none; read once per process per file version."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"env.dataset {path} does not exist")
    stat = p.stat()
    return [dict(row) for row in _read(str(p.resolve()), stat.st_mtime_ns, stat.st_size)]


@functools.cache
def _read(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a small file; the bars would print in every process
    try:
        loaded = _load(Path(path))
    finally:
        if shown:
            datasets.enable_progress_bars()
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("train", loaded)]
    named = isinstance(loaded, datasets.DatasetDict) and len(loaded) > 1
    rows = []
    for split, part in parts:
        for row in part:
            if named and row.get("split") is None:
                row = {**row, "split": split}
            rows.append(row)
    return tuple(rows)


def _load(p: Path) -> Any:
    """The dataset at `p`, read into memory (its conversion cache is a temporary folder)."""
    import tempfile

    import datasets

    path = str(p)
    try:
        if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
            return datasets.load_from_disk(path, keep_in_memory=True)
        if p.is_file() and p.suffix not in _BUILDERS:
            raise DatasetError(f"env.dataset {path}: read {', '.join(_BUILDERS)} files, a "
                               "folder of them, or a save_to_disk folder")
        with tempfile.TemporaryDirectory() as cache:
            if p.is_file():
                return datasets.load_dataset(_BUILDERS[p.suffix], data_files=path,
                                             cache_dir=cache, keep_in_memory=True)
            return datasets.load_dataset(path, cache_dir=cache, keep_in_memory=True)
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
        raise DatasetError(f"env.dataset {path} cannot be read: {type(e).__name__}: "
                           f"{str(e)[:200]}") from None


def split_tasks(rows: list[dict[str, Any]], name: str, seed: int) -> dict[str, list[Task]]:
    """{"train": train then val rows, "test": test rows} as tasks; a DatasetError names the
    first row that cannot be a task."""
    out: dict[str, list[Task]] = {"train": [], "val": [], "test": []}
    for i, row in enumerate(rows):
        try:
            state_json.encode(row, "row")
        except state_json.StateError as e:
            raise DatasetError(f"env.dataset row {i}: {e}") from None
        split = row_split(row, i, seed)
        out[split].append(Task(f"{name}-{i}", name, instruction(row.get("prompt"), i),
                               "test" if split == "test" else "train", row))
    return {"train": out["train"] + out["val"], "test": out["test"]}


def row_split(row: dict[str, Any], i: int, seed: int) -> str:
    """The row's `split` where it names one, else a seeded hash of its content."""
    named = row.get("split")
    if named is not None:
        if named not in SPLITS:
            raise DatasetError(f"env.dataset row {i}: split {str(named)[:40]!r} is not one of "
                               f"{', '.join(SPLITS)}")
        return SPLITS[named]
    text = json.dumps(row, sort_keys=True, ensure_ascii=False)
    digest = int(hashlib.sha256(f"{seed}:{text}".encode()).hexdigest(), 16)
    return "test" if digest % 5 == 0 else "train"


def instruction(prompt: Any, i: int) -> str:
    """A prompt as the task's instruction: the string, or the texts of its messages joined by
    blank lines; no prompt (TRL allows none where reset() writes the task) is an empty one."""
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    if isinstance(prompt, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                        for m in prompt):
        return "\n\n".join(m["content"] for m in prompt if m["content"])
    raise DatasetError(f"env.dataset row {i}: prompt must be a string or a list of messages "
                       "with text content ({'role': 'user', 'content': '...'})")


def prompt_messages(prompt: Any, observation: str | None) -> list[dict[str, Any]]:
    """The prompt as TRL's reward functions receive it: messages, with reset()'s text appended
    to the last one's content."""
    messages = [{"role": "user", "content": prompt or ""}] if not isinstance(prompt, list) \
        else [dict(m) for m in prompt] or [{"role": "user", "content": ""}]
    if observation:
        messages[-1]["content"] = messages[-1]["content"] + observation
    return messages

"""Export the mined data as a Hugging Face dataset folder, and push it to the Hub.

The folder is laid out as `datasets.push_to_hub(repo, config_name=C, data_dir=f"data/{C}")`
writes it: `data/<config>/train-0000i-of-0000n.parquet` per config and a README.md whose YAML
`configs:` header lets `datasets.load_dataset(folder_or_repo, C)` find each config. Columns
are TRL's conversational format (docs/data.md lists every one): `trl.DPOTrainer` reads the
pair configs and `trl.SFTTrainer` the example configs unchanged.

Tool calls follow the OpenAI convention, `arguments` a JSON string, and `tools` is a JSON
string (TRL parses both), so every row has one Arrow schema whatever the tools' arguments.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from offline_agent.mining.advice import NO_ROWS, NO_STEP_PAIRS
from storage import Store

ROWS_PER_SHARD = 10_000
CONFIGS = ("pairs", "trajectory_pairs", "rft", "hindsight")

_CALL = pa.struct([("type", pa.string()),
                   ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()),
                     ("tool_calls", pa.list_(_CALL))])
MESSAGES = pa.list_(MESSAGE)
_COMMON = [("tools", pa.string()), ("run_id", pa.string()), ("task_id", pa.string()),
           ("env", pa.string())]
SCHEMAS = {
    "pairs": pa.schema([("prompt", MESSAGES), ("chosen", MESSAGES), ("rejected", MESSAGES),
                        *_COMMON, ("kind", pa.string()), ("node_id", pa.int64()),
                        ("chosen_node", pa.int64()), ("rejected_node", pa.int64()),
                        ("chosen_q", pa.float64()), ("rejected_q", pa.float64()),
                        ("margin", pa.float64())]),
    "trajectory_pairs": pa.schema([("prompt", MESSAGES), ("chosen", MESSAGES),
                                   ("rejected", MESSAGES), *_COMMON, ("kind", pa.string()),
                                   ("chosen_traj", pa.int64()), ("rejected_traj", pa.int64()),
                                   ("chosen_q", pa.float64()), ("rejected_q", pa.float64()),
                                   ("margin", pa.float64())]),
    "rft": pa.schema([("messages", MESSAGES), *_COMMON, ("kind", pa.string()),
                      ("instruction", pa.string()), ("source_traj", pa.int64()),
                      ("reward", pa.float64())]),
    "hindsight": pa.schema([("messages", MESSAGES), *_COMMON, ("instruction", pa.string()),
                            ("source_task_id", pa.string()), ("source_traj", pa.int64()),
                            ("source_reward", pa.float64())]),
}


class ExportError(RuntimeError):
    """An export that cannot be done as asked (nothing mined, target exists, Hub refused)."""


def openai_messages(messages: list[dict]) -> list[dict]:
    """Chat dicts with every tool call's arguments as a JSON string."""
    out = []
    for m in messages:
        calls = [{"type": "function",
                  "function": {"name": c["function"]["name"],
                               "arguments": json.dumps(c["function"]["arguments"])}}
                 for c in m.get("tool_calls") or []]
        out.append({"role": m["role"], "content": m["content"], "tool_calls": calls or None})
    return out


def config_rows(store: Store, tools: str, include_hindsight_in_rft: bool,
                mine: str) -> dict[str, list]:
    """Every config's rows (dicts by dataset column), from the pairs and examples stage `mine`
    stored (round 1's `mine`, or round k's `mine@k` of run.iterations)."""
    run_id = store.run_id
    rows: dict[str, list] = {c: [] for c in CONFIGS}
    for p in store.pairs(stage=mine):
        row = {"prompt": openai_messages(p.prompt), "chosen": openai_messages(p.chosen),
               "rejected": openai_messages(p.rejected), "tools": tools, "run_id": run_id,
               "task_id": p.task_id, "env": p.env, "kind": p.kind,
               "chosen_q": p.chosen_q, "rejected_q": p.rejected_q, "margin": p.margin}
        if p.kind == "step":
            rows["pairs"].append({**row, "node_id": p.node_id, "chosen_node": p.chosen_ref,
                                  "rejected_node": p.rejected_ref})
        else:
            rows["trajectory_pairs"].append({**row, "chosen_traj": p.chosen_ref,
                                             "rejected_traj": p.rejected_ref})
    for e in store.examples(stage=mine):
        row = {"messages": openai_messages(e.messages), "tools": tools, "run_id": run_id,
               "task_id": e.task_id, "env": e.env, "instruction": e.instruction,
               "source_traj": e.source_traj}
        if e.kind == "rft" or include_hindsight_in_rft:
            rows["rft"].append({**row, "kind": e.kind, "reward": e.reward})
        if e.kind == "hindsight":
            rows["hindsight"].append({**row, "source_task_id": e.info["source_task_id"],
                                      "source_reward": e.info["source_reward"]})
    return rows


def config_tables(rows: dict[str, list]) -> dict[str, pa.Table]:
    """The configs with rows as Arrow tables. A config without rows gets none, so no files:
    `datasets` cannot load an empty split (a parquet of 0 rows raises ArrowInvalid, one of
    no row groups "corresponds to no data")."""
    return {c: pa.Table.from_pylist(data, schema=SCHEMAS[c]) for c, data in rows.items() if data}


def write_dataset(out: Path, tables: dict[str, pa.Table], card: str) -> None:
    """Write the folder next to `out`, then move it into place."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for config, table in tables.items():
        n = max(1, -(-table.num_rows // ROWS_PER_SHARD))
        folder = tmp / "data" / config
        folder.mkdir(parents=True)
        for i in range(n):
            part = table.slice(i * ROWS_PER_SHARD, ROWS_PER_SHARD)
            pq.write_table(part, folder / f"train-{i:05d}-of-{n:05d}.parquet")
    (tmp / "README.md").write_text(card)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def dataset_info(tables: dict[str, pa.Table]) -> list[dict]:
    """The card's `dataset_info` (features, rows and bytes per config), as push_to_hub writes
    it. Besides describing the data, it keys `datasets`' cache: a local folder's cache is
    found by the folder's name and its card alone, so without it a new export into a folder
    of the same name (every run's RUN_DIR/export) loads the rows cached from the last one."""
    from datasets import DatasetInfo, Features, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict

    infos = DatasetInfosDict({c: DatasetInfo(
        config_name=c, features=Features.from_arrow_schema(t.schema), dataset_size=t.nbytes,
        splits=SplitDict({"train": SplitInfo("train", num_bytes=t.nbytes,
                                             num_examples=t.num_rows)}))
        for c, t in tables.items()})
    card: dict = {}
    infos.to_dataset_card_data(card)
    return card["dataset_info"] if tables else []


def dataset_card(counts: dict[str, int], tables: dict[str, pa.Table], config: dict,
                 run_id: str, model: str, mine: str) -> str:
    header = {"configs": [{"config_name": c, "data_files": [
        {"split": "train", "path": f"data/{c}/train-*"}]} for c in tables],
        "dataset_info": dataset_info(tables),
        "tags": ["trl", "dpo", "agent", "tool-use", "mcts", "offline-agent"]}
    table = "\n".join(f"| `{c}` | {counts[c] or '0 (left out: an empty split cannot be loaded)'} |"
                      for c in CONFIGS)
    return f"""---
{yaml.safe_dump(header, sort_keys=False)}---

# Agent preference data from offline-agent run `{run_id}`

Made by offline-agent following Agent Q (Putta et al. 2024,
arXiv 2408.07199): the policy `{model}` searched each training task of the
`{config["env"]["name"]}` environment with Monte Carlo tree search (at every node it proposed
actions, ranked them itself as a critic, and rollouts were scored by the environment's
verifier). `pairs` holds step-level preferences between sibling actions whose values
Q = alpha*Q_mcts + (1-alpha)*critic (a finished episode's step: its reward) differ by at
least theta; `trajectory_pairs` a
successful vs a failed episode of one task (outcome DPO); `rft` successful episodes for
rejection-sampling fine-tuning{_rft_note(config)}; `hindsight` failed episodes
relabeled with the goal they reached, each verified by replaying its actions under the new goal.{_round_note(mine)}

| config | rows |
|---|---|
{table}

```python
from datasets import load_dataset
pairs = load_dataset("PATH_OR_REPO", "pairs", split="train")  # trl.DPOTrainer reads it as is
```

Model: `{model}`. Columns: see docs/data.md of offline-agent. Tool calls carry their
arguments as JSON strings and `tools` is the JSON list of the environment's tool schemas.

## Run configuration

```yaml
{yaml.safe_dump(config, sort_keys=False)}```
"""


def _rft_note(config: dict) -> str:
    on = config["mine"]["rft_hindsight"]
    return " (and the hindsight rows, mine.rft_hindsight)" if on else ""


def left_out(store: Store, counts: dict[str, int], mine: str = "mine") -> list[str]:
    """A warning line per config the export left out (no rows), saying why."""
    row = store.stage(mine)
    advice = (row.stats or {}).get(NO_STEP_PAIRS) if row else None
    lines = []
    for config, kind in zip(CONFIGS, ("step", "trajectory", "rft", "hindsight")):
        if not counts[config]:
            why = NO_ROWS[kind] + (f"; {advice}" if kind == "step" and advice else "")
            lines.append(f"warning: config {config!r} left out of the dataset, as `datasets` "
                         f"cannot load an empty split: {why}")
    return lines


def _round_note(mine: str) -> str:
    if mine == "mine":
        return ""
    return (f"\nThese rows are stage `{mine}`'s, a later round of `run.iterations`: its "
            "search ran with the adapters the\nearlier rounds trained merged into that policy.")


def export(store: Store, out: Path, tools: list[dict], config: dict,
           mine: str = "mine") -> dict[str, int]:
    """Write the pairs and examples of stage `mine` (a round's mine stage, round 1's by
    default) to the dataset folder `out`; rows per config."""
    row = store.stage(mine)
    if row is None or row.status != "done":
        raise ExportError(f"nothing to export: the run has no finished `{mine}` stage yet")
    rows = config_rows(store, json.dumps(tools), config["mine"]["rft_hindsight"], mine)
    counts = {c: len(r) for c, r in rows.items()}
    tables = config_tables(rows)
    write_dataset(out, tables, dataset_card(counts, tables, config, store.run_id,
                                            config["model"]["id"], mine))
    return counts


def push(folder: Path, repo_id: str, private: bool, revision: str | None, api=None) -> str:
    """Upload the folder as one commit (nothing half-written on failure); returns its URL.
    The commit also deletes the repo's data files this export does not hold, so a config
    that is empty now (left out of the card) loses an earlier push's rows too.

    The token comes from HF_TOKEN or the login cache (huggingface_hub's own lookup) and
    is never printed: errors are reduced to one line with any token text removed."""
    from huggingface_hub import HfApi

    api = api or HfApi()
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="dataset",
                                 revision=revision, delete_patterns=["data/*"],
                                 commit_message="offline-agent export")
    except Exception as e:  # network, auth, permissions: all end the same way for the user
        raise ExportError(f"push to the Hub failed: {_one_line(e)}. Check the network and "
                          "your token (HF_TOKEN or `hf auth login`); the dataset stays in "
                          f"{folder}") from None
    return info.commit_url


def _one_line(error: Exception) -> str:
    from huggingface_hub import get_token

    text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    for token in {os.environ.get("HF_TOKEN"), get_token()} - {None, ""}:
        text = text.replace(token, "***")
    return text

"""Where each artifact of a run's rounds lives and how a stage loads it, and the keys of the
records one stage writes and another (or the report) reads. Stages import this module, never
each other (tests/test_imports.py).

  round k's model (k >= 2)     RUN_DIR/checkpoints/search@k/iterate        (search@k, "iterate")
  round k's learned critic     RUN_DIR/checkpoints/critic@k/final          (critic@k, "critic/final")
  a trained policy's adapter   RUN_DIR/checkpoints/train@k/<policy>/final  (train@k, "<policy>/final")
  its step candidates          RUN_DIR/checkpoints/train@k/<policy>/candidates/step-<n>

(stage, key) is the store's checkpoint record; a folder is recorded relative to RUN_DIR.

Round k >= 2 searches with, and trains a fresh LoRA on top of, the iterate of round k-1:
round k-1's model with the final adapter of its `train.iterate` policy merged in, written as
a full model folder. Its DPO reference (the model with its adapter disabled) is therefore that
iterate. The train stage of round k-1 writes it once it has trained (when run.iterations asks
for round k); a run whose train stage finished before run.iterations was raised gets it from
the first stage of round k that loads it. It is recorded under search@k, the first stage of
round k, so `--force` of a changed round clears it with the round.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

from offline_agent.evaluation import BASE
from pipelines.config import ModelConfig, RunConfig, make_env
from pipelines.errors import RunError
from pipelines.rounds import round_name
from storage import Store

ITERATE = "iterate"  # search@k's checkpoint key (and folder) of the model round k runs with
CRITIC = "critic/final"  # the critic stage's checkpoint key of a finished fit
VALUES = "values.json"  # node id -> V, beside the fitted critic
CANDIDATES = "candidates"  # folder of kept step adapters, under a trained policy's folder

# keys of stage stats and records that other readers look up
CONCORDANCE = "critic_concordance"  # search's and critic's stats, and report.json's
FROZEN = "frozen_critic_concordance"  # the critic stage's: the frozen critic on its held-out trees
HELD_OUT = "held_out"  # a trained policy's final record and its report entry: held-out pairs


# ---- round k's model -----------------------------------------------------------------------
def round_model(cfg: RunConfig, store: Store, run_dir: Path, r: int) -> ModelConfig:
    """The model round r searches with and trains on: cfg.model in round 1, else round r's
    iterate (a full model folder, so no adapter), written first where it is missing."""
    if r == 1:
        return cfg.model
    value = iterate_record(cfg, store, run_dir, r)
    return replace(cfg.model, id=str(run_dir / value["folder"]), adapter=None)


def iterate_policy(cfg: RunConfig) -> str:
    """The policy whose final adapter the next round continues from."""
    return cfg.train.iterate or cfg.train.policies[-1]


def stored_iterate(store: Store, r: int) -> dict | None:
    """The record of round r's model ({"folder", "policy", "adapter"}); None before it is
    written."""
    return store.checkpoint(round_name("search", r), "", ITERATE)


def iterate_record(cfg: RunConfig, store: Store, run_dir: Path, r: int) -> dict:
    """The record of round r's model (r >= 2), written first where it is missing."""
    return stored_iterate(store, r) or write_iterate(cfg, store, run_dir, r)


def write_merged_whole(out: Path, model, adapter: Path, cfg: RunConfig) -> None:
    """`model` (a round's model: id and adapter) with `adapter` merged in, written to `out`
    whole: beside it first, then moved over any older one or one a crash left unrecorded."""
    from offline_agent.training.model import write_merged

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_merged(model.id, str(adapter), str(tmp), cfg.train, base_adapter=model.adapter)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def write_iterate(cfg: RunConfig, store: Store, run_dir: Path, r: int) -> dict:
    """Round r's model (r >= 2): round r-1's model with its iterate policy's final adapter
    merged in, written whole to RUN_DIR/checkpoints/search@r/iterate (replacing one there),
    then recorded; returns the record. A RunError where round r-1 did not train that policy."""

    policy, train = iterate_policy(cfg), round_name("train", r - 1)
    final = store.checkpoint(train, "", f"{policy}/final")
    if final is None:
        row = store.stage(train)
        raise RunError(f"round {r} starts from round {r - 1}'s {policy!r} policy, which stage "
                       f"{train!r} has not trained (stats: {row.stats if row else None}); "
                       "set train.iterate to a policy it trained")
    previous = round_model(cfg, store, run_dir, r - 1)
    folder = run_dir / "checkpoints" / round_name("search", r)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / ITERATE
    write_merged_whole(out, previous, run_dir / final["folder"], cfg)
    value = {"folder": str(out.relative_to(run_dir)), "policy": round_name(policy, r - 1),
             "adapter": final["folder"]}
    store.set_checkpoint(round_name("search", r), "", ITERATE, value)
    return value


# ---- trained policies ----------------------------------------------------------------------
def trained_policies(store: Store) -> dict[str, dict]:
    """{policy name of its round: the final checkpoint train@k recorded}, by round, then in
    the order each round finished them. A round without any trained policy ends the list:
    no later round can have run (it would start from one)."""
    out: dict[str, dict] = {}
    r = 1
    while finals := store.final_checkpoints(round_name("train", r)):
        out.update({round_name(name, r): value for name, value in finals.items()})
        r += 1
    return out


def eval_policies(store: Store, run_dir: Path, r: int = 1) -> dict[str, str | None]:
    """{policy: adapter folder} that round r's eval plays: base (no adapter; round 1 only),
    then each policy round r trained (round 1 also GRPO's), named for its round."""
    out: dict[str, str | None] = {BASE: None} if r == 1 else {}
    finals = store.final_checkpoints(round_name("train", r))
    if r == 1:  # GRPO refines round 1's policy (stage grpo)
        finals.update(store.final_checkpoints("grpo"))
    for name, value in finals.items():
        name = round_name(name, r)
        folder = Path(value["folder"])
        folder = folder if folder.is_absolute() else run_dir / folder
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"policy {name!r}: the train stage recorded adapter folder "
                                    f"{folder}, which holds no adapter_config.json")
        out[name] = str(folder)
    return out


def best_on_validation(store: Store) -> str:
    """The trained policy (any round, GRPO included) whose selected checkpoint scored best on
    the validation tasks (success, then mean reward; train.select or grpo.select val); a
    RunError where no policy was scored there."""
    finals = {**trained_policies(store), **store.final_checkpoints("grpo")}
    scored = {}
    for name, final in finals.items():
        chosen = (final.get("selected") or {})
        best = [c for c in chosen.get("candidates", []) if c["step"] == chosen.get("step")]
        if best:
            scored[name] = (best[0]["success_rate"] or 0.0, best[0]["mean_reward"] or 0.0)
    if not scored:
        raise RunError("eval.mcts_policies names best, but no trained policy was scored on the "
                       "validation tasks: set train.select (or grpo.select) to val")
    return max(scored, key=lambda name: scored[name])


def keep_candidate(folder: Path, step: int, saved: Path) -> Path:
    """Copy step checkpoint `saved`'s adapter files (not trainer_state.pt) to
    folder/candidates/step-<step>, whole or not at all."""
    from offline_agent.training.checkpoint import STATE, write_atomic

    def fill(tmp: Path) -> None:
        for f in saved.iterdir():
            if f.is_file() and f.name != STATE:
                shutil.copy2(f, tmp / f.name)
    return write_atomic(folder / CANDIDATES / f"step-{step}", fill)


def candidates(folder: Path, final: dict) -> list[tuple[int, Path]]:
    """(step, adapter folder) of every kept candidate, in step order, then the final one."""
    kept = [(int(p.name.removeprefix("step-")), p)
            for p in (folder / CANDIDATES).glob("step-*") if p.is_dir()]
    kept = [(s, p) for s, p in sorted(kept) if s < final["step"]]
    return kept + [(final["step"], folder / "final")]


# ---- the learned critic --------------------------------------------------------------------
def fitted_folder(store: Store, run_dir: Path, r: int) -> Path | None:
    """The folder of the critic round r's stage fitted (None: round r fitted none)."""
    final = store.checkpoint(round_name("critic", r), "", CRITIC)
    return None if final is None else run_dir / final["folder"]


def load_learned_critic(cfg: RunConfig, store: Store, run_dir: Path, r: int):
    """The value model critic@r fitted, ready to score (search in round r + 1, eval.mcts in
    round r); a RunError where it fitted none."""
    from offline_agent.value.learned_critic import LearnedCritic
    from offline_agent.value.value_model import resolve_device

    return LearnedCritic.load(_fitted(store, run_dir, r), make_env(cfg),
                              resolve_device(cfg.model.device), cfg.critic.pack_tokens)


def learned_values(store: Store, run_dir: Path, r: int) -> dict[int, float]:
    """node id -> V of every node of the trees critic@r fitted on, as mining reads them."""
    values = json.loads((_fitted(store, run_dir, r) / VALUES).read_text())
    return {int(k): v for k, v in values.items()}


def _fitted(store: Store, run_dir: Path, r: int) -> Path:
    """fitted_folder, or a RunError where round r fitted none."""
    folder = fitted_folder(store, run_dir, r)
    if folder is None:
        raise RunError(f"search.critic is learned, but stage {round_name('critic', r)!r} has "
                       "fitted no critic; run it first")
    return folder

"""Online GRPO for real: rollouts on the model being trained, updates, a learning signal on
tiny envs, token-in/token-out, the stage in a DuckDB store, SIGKILL and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from offline_agent.policy.hf import HFPolicy
from offline_agent.rollout import run_episodes
from offline_agent.training.config import TrainConfig
from offline_agent.training.grpo.config import GRPOConfig
from offline_agent.training.grpo.rollouts import member_seeds, sample_groups
from offline_agent.training.grpo.train import train_grpo
from offline_agent.training.grpo.update import make_batch, rewards, turn_advantages, update
from offline_agent.training.model import add_lora
from pipelines.artifacts import eval_policies
from pipelines.config import RunConfig
from pipelines.runner import run
from pipelines.stages import STAGES
from storage import Store
from tests.pick_env import Pick, PickTwice, biased_tiny_model

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

GRPO = [s for s in STAGES if s.name in ("tasks", "grpo")]


def setup(tokenizer, seed: int = 0):
    model = add_lora(biased_tiny_model(tokenizer, seed), TrainConfig(lora_r=8, seed=seed))
    return model, HFPolicy(model, tokenizer, max_batch=32, seed=seed)


def success(model, policy, env, tasks) -> float:
    """Sampled success on `tasks`, four seeded episodes each (the policy's rate, not one draw)."""
    model.eval()
    trajs = run_episodes(policy, env, tasks * 4, temperature=1.0, seeds=list(range(4 * len(tasks))),
                         batch_size=32)
    policy.clear_cache()
    return sum(t.success for t in trajs) / len(trajs)


@pytest.mark.parametrize("env, step_groups, steps, group_size, format_weight",
                         [(Pick, False, 100, 8, 0.0), (PickTwice, True, 150, 16, 0.1)])
def test_grpo_learns_to_call_the_tool_the_instruction_names(tokenizer, tmp_path, env,
                                                           step_groups, steps, group_size,
                                                           format_weight):
    """From chance (1 in 4 tools) to clearly above it on held-out tasks in 100 seeded steps;
    the two-step variant, where only the second call decides, in 150 with state-grouped
    steps. Its first call's advantage is pure noise, which collapses both calls onto one
    tool for a while; with groups of 8 the escape came by step 150 for 2 of 5 seeds (a new
    CPU's rounding acts like a new seed), with groups of 16 and a format penalty (so that
    mass pushed off wrong tools does not leak to non-tool tokens) for 5 of 5 above 0.75."""
    model, policy = setup(tokenizer)
    test = env().tasks("test", 16)
    before = success(model, policy, env, test)
    cfg = GRPOConfig(enabled=True, init="base", steps=steps, group_size=group_size,
                     tasks_per_step=4, lr=3e-3, max_resample=0, step_groups=step_groups,
                     format_weight=format_weight, save_every=1000)
    train_grpo(model, policy, env, env().tasks("train", 8), cfg, tmp_path, seed=0, batch_size=32,
               pack_tokens=3072, max_tokens=4)
    after = success(model, policy, env, test)
    assert before < 0.45 and after > 0.7, (before, after)


def test_turns_are_trained_on_the_ids_the_policy_was_sampled_on(tokenizer, tiny_model_dir):
    """Token-in/token-out: each turn's context is exactly the ids the decoder was fed for
    the prompt it sampled from, its action the ids it drew; the trained sequence is their
    concatenation, masked on the action only. Multi-turn MiniShop, so later turns' contexts
    hold earlier actions and observations (benchmarks/grpo_token_drift.py measures the same
    on a real run)."""
    from transformers import AutoModelForCausalLM

    from offline_agent.envs.base import load_env

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    seen: list[tuple[list[int], list[int]]] = []

    class Recording(HFPolicy):
        def _generate(self, rows, sampling, on_done):
            def record(done, completion):  # the row's ids as prefilled, the ids it drew
                seen.append((list(done.ids), list(completion.token_ids)))
                return on_done(done, completion)
            return super()._generate(rows, sampling, record)

    policy = Recording(model, tokenizer, max_batch=8, seed=0)
    make_env = lambda: load_env("minishop", seed=0, max_steps=3)  # noqa: E731
    tasks = make_env().tasks("train", 2)
    rollouts = sample_groups(policy, make_env, tasks, 2, 1.0,
                             [member_seeds(0, 0, 0, 2) for _ in tasks], batch_size=8)
    turns = [(t.context, t.action) for r in rollouts for t in r.turns]
    assert len(turns) == len(seen) > len(rollouts)  # several turns per episode
    assert sorted(map(str, turns)) == sorted(map(str, seen))
    adv = turn_advantages(rollouts, rewards(rollouts, GRPOConfig()), GRPOConfig())
    batch = make_batch(rollouts, adv)
    for seq, (context, action) in zip(batch.seqs, [t for t in turns if t[1]]):
        assert seq.ids == context + action
        assert seq.mask == [0] * len(context) + [1] * len(action)


def test_the_first_update_has_ratio_exactly_one_and_moves_the_adapter(tokenizer):
    """pi_old is a forward of the same weights, so at mu = 1 the ratio is exactly 1 (nothing
    clipped), and the update trains the LoRA weights on the agent tokens only."""
    model, policy = setup(tokenizer)
    tasks = PickTwice().tasks("train", 4)
    rollouts = sample_groups(policy, PickTwice, tasks, 4, 1.0,
                             [member_seeds(0, 0, 0, 4) for _ in tasks], batch_size=32)
    cfg = GRPOConfig(group_size=4, lr=1e-3, num_iterations=1)
    batch = make_batch(rollouts, turn_advantages(rollouts, rewards(rollouts, cfg), cfg))
    assert any(a != 0 for a in batch.advantage)  # a group that does not tie: a real update
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.train()
    metrics = update(model, optimizer, batch, cfg, pack_tokens=3072, max_tokens=4)
    assert metrics["ratio"] == 1.0 and metrics["clip_fraction"] == 0.0
    assert metrics["agent_tokens"] == sum(s.action_tokens for s in batch.seqs) == len(batch.seqs)
    moved = [n for n, p in model.named_parameters() if p.requires_grad
             and not torch.equal(p.detach(), lora[n])]
    assert moved


def grpo_config(model_dir: str, steps: int = 4, **grpo) -> dict:
    return {"model": {"id": model_dir, "device": "cpu", "max_batch": 32},
            "env": {"name": "tests.pick_env:PickTwice", "train_tasks": 8, "test_tasks": 4},
            "train": {"lora_r": 8},
            "grpo": {"enabled": True, "init": "base", "steps": steps, "group_size": 4,
                     "tasks_per_step": 2, "lr": 5e-4, "num_iterations": 2, "save_every": 2,
                     **grpo}}


@pytest.fixture(scope="module")
def pick_model_dir(tmp_path_factory, tokenizer) -> str:
    out = tmp_path_factory.mktemp("pick-model")
    biased_tiny_model(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def metrics(run_dir: Path) -> dict[int, dict]:
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        return {r.step: r.data for r in store.metrics("grpo", "grpo")}


def test_the_stage_records_metrics_and_its_adapter_which_eval_then_plays(pick_model_dir,
                                                                         tmp_path):
    cfg = RunConfig.from_dict({**grpo_config(pick_model_dir, steps=2),
                               "run": {"report_to": ["tensorboard"]}})
    stats = run(cfg, tmp_path / "r", GRPO)["grpo"]["stats"]
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert store.checkpoint("grpo", "", "grpo/final") == stats
        assert eval_policies(store, tmp_path / "r")["grpo"].endswith("checkpoints/grpo/grpo/final")
    data = metrics(tmp_path / "r")
    assert sorted(data) == [1, 2]
    assert {"reward_mean", "success", "kl", "clip_fraction", "entropy", "tied_groups",
            "resampled_groups", "rollout_tokens_per_s", "update_tokens_per_s"} <= set(data[1])
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"))  # run.report_to
    events.Reload()
    for key in ("reward_mean", "kl", "clip_fraction", "entropy"):
        logged = {e.step: e.value for e in events.Scalars(f"grpo/grpo/{key}")}
        assert logged == pytest.approx({step: data[step][key] for step in (1, 2)}, abs=1e-6)
    assert run(cfg, tmp_path / "r", GRPO)["grpo"]["status"] == "skipped"


def test_select_val_chooses_the_step_on_validation_and_eval_plays_the_choice(pick_model_dir,
                                                                            tmp_path):
    """grpo.select: val keeps each step checkpoint, plays it and the last step on the
    validation tasks (split val, never the test table) and records the best as grpo/final,
    which eval then plays: GRPO's step count chosen on validation."""
    from offline_agent.evaluation import EvalConfig
    from pipelines.headlines import headline
    from pipelines.report import build_report

    settings = grpo_config(pick_model_dir, steps=4, select="val")
    settings["env"]["val_tasks"] = 4
    stats = run(RunConfig.from_dict(settings), tmp_path / "r", GRPO)["grpo"]["stats"]
    chosen = stats["selected"]
    assert [c["step"] for c in chosen["candidates"]] == [2, 4]
    assert chosen["step"] in (2, 4) and stats["folder"] == next(
        c["folder"] for c in chosen["candidates"] if c["step"] == chosen["step"])
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        for step in (2, 4):
            played = store.eval_episodes(f"grpo/step-{step}", split="val")
            assert len(played) == 4 and not store.eval_episodes(f"grpo/step-{step}",
                                                                split="test")
        assert eval_policies(store, tmp_path / "r")["grpo"] == str(tmp_path / "r" /
                                                                   stats["folder"])
        assert build_report(store, EvalConfig())["selection"]["grpo"] == chosen
    best = next(c for c in chosen["candidates"] if c["step"] == chosen["step"])
    assert headline("grpo", stats).endswith(  # what `status` shows
        f", val {best['success_rate']:.1%} of 4 at step {chosen['step']} of 4")
    assert (tmp_path / "r" / "checkpoints/grpo/grpo/candidates/step-2/adapter_config.json"
            ).is_file()


def test_the_stage_shows_a_bar_of_its_steps_with_reward_and_loss(pick_model_dir, tmp_path,
                                                                 capsys):
    """What a person sees while GRPO runs: a bar of the step out of grpo.steps, each step's mean
    reward and loss, elapsed<remaining; progress.json holds step and steps."""
    import re

    from pipelines.progress import read_progress
    from tests.test_train_stage import bar_states

    run(RunConfig.from_dict(grpo_config(pick_model_dir, steps=2)), tmp_path / "r", GRPO)
    shown = [re.search(r"\| (\d+)/(\d+) \[(.*)\]$", s).groups()
             for s in bar_states(capsys.readouterr().err, "grpo")]
    assert {t for _, t, _ in shown} == {"2"}
    last = {int(n): tail for n, _, tail in shown}  # a step's last redraw, in step order
    assert list(last) == [0, 1, 2]
    for n, data in metrics(tmp_path / "r").items():
        assert re.match(r"\d\d:\d\d<\d\d:\d\d, ", last[n])
        assert last[n].endswith(f"reward={data['reward_mean']:.3f}, loss={data['loss']:.4f}")
    counters = read_progress(tmp_path / "r")["counters"]
    assert (counters["step"], counters["steps"]) == (2, 2)


def test_grpo_dtype_is_the_dtype_it_samples_and_trains_in(pick_model_dir, tmp_path,
                                                          monkeypatch):
    """grpo.dtype bfloat16 loads GRPO's model in bfloat16 (train.dtype stays DPO's), while
    the adapter it trains, and so AdamW's master weights, stay float32."""
    from safetensors.torch import load_file

    import offline_agent.training.model as model_module

    seen, real = [], model_module.load_base
    monkeypatch.setattr(model_module, "load_base", lambda model_id, cfg, *a: (
        seen.append(cfg.dtype), real(model_id, cfg, *a))[1])
    settings = grpo_config(pick_model_dir, steps=1, dtype="bfloat16")
    run(RunConfig.from_dict(settings), tmp_path / "r", GRPO)
    assert seen == ["bfloat16"] and RunConfig.from_dict(settings).train.dtype == "auto"
    weights = load_file(tmp_path / "r/checkpoints/grpo/grpo/final/adapter_model.safetensors")
    assert weights and {v.dtype for v in weights.values()} == {torch.float32}


def test_a_disabled_stage_does_nothing(pick_model_dir, tmp_path):
    cfg = RunConfig.from_dict(grpo_config(pick_model_dir, enabled=False))
    assert run(cfg, tmp_path / "r", GRPO)["grpo"]["stats"] == {"skipped": "grpo.enabled is false"}
    assert metrics(tmp_path / "r") == {}


def test_resume_after_sigkill_samples_the_same_next_rollouts_with_the_same_loss(
        pick_model_dir, tmp_path):
    settings = grpo_config(pick_model_dir, steps=4)
    script = ("import json, os, signal, sys\nfrom pipelines.config import RunConfig\n"
              "from pipelines.runner import run\nfrom pipelines.stages import STAGES\n"
              "from offline_agent.training.grpo import train as grpo_train\n"
              "grpo_train.after_step = lambda step: step == 3 and os.kill(os.getpid(), "
              "signal.SIGKILL)\n"
              "run(RunConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], "
              "[s for s in STAGES if s.name in ('tasks', 'grpo')])\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(settings),
                           str(tmp_path / "killed")], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    with Store(tmp_path / "killed" / "store.duckdb", read_only=True) as store:
        assert store.checkpoint("grpo", "", "grpo")["step"] == 2
    cfg = RunConfig.from_dict(settings)
    run(cfg, tmp_path / "killed", GRPO)
    run(cfg, tmp_path / "whole", GRPO)
    resumed, whole = metrics(tmp_path / "killed"), metrics(tmp_path / "whole")
    assert sorted(resumed) == sorted(whole) == [1, 2, 3, 4]
    assert whole[3]["loss"] != whole[4]["loss"]
    for step in (3, 4):
        for key in ("reward_mean", "rollouts", "loss", "ratio"):
            assert resumed[step][key] == pytest.approx(whole[step][key], rel=1e-5, abs=1e-7)


def test_on_vllm_each_step_serves_the_adapter_just_updated_under_a_new_id(
        request, pick_model_dir, tokenizer, tmp_path):
    """The vLLM path (against the fake module; vLLM needs a GPU): before each step's
    rollouts the adapter is saved and requested under a new LoRA id, so a stale adapter
    cannot be served; the rollouts train like the hf path's."""
    from offline_agent.training.grpo.train import rollout_policy
    from tests.pick_env import NAMES

    model, _ = setup(tokenizer)  # first: peft imports bitsandbytes, which the fake's cuda confuses
    fake_vllm = request.getfixturevalue("fake_vllm")
    names = [tokenizer(n, add_special_tokens=False).input_ids[0] for n in NAMES]
    draws = iter(range(10**6))
    fake_vllm.reply = lambda ids: ([names[next(draws) * 7 % 4]], "length", None)
    policy, sync = rollout_policy(model, tokenizer, pick_model_dir, "vllm", tmp_path, 0, 32, None)
    cfg = GRPOConfig(enabled=True, init="base", steps=3, group_size=4, tasks_per_step=2, lr=1e-2,
                     max_resample=0, save_every=1000)
    seen = []
    train_grpo(model, policy, Pick, Pick().tasks("train", 4), cfg, tmp_path, seed=0,
               batch_size=32, pack_tokens=3072, max_tokens=1, sync=sync,
               on_metrics=lambda s, m: seen.append(m))
    requests = [call["lora"].args for call in fake_vllm.llms[0].calls]
    assert [r[1] for r in requests] == [2, 3, 4]  # one generate per (one-turn) step, new ids
    assert [Path(r[2]).name for r in requests] == ["step-0", "step-1", "step-2"]
    assert fake_vllm.llms[0].kwargs["enable_lora"] and fake_vllm.llms[0].kwargs[
        "gpu_memory_utilization"] == 0.5
    assert sorted(p.name for p in (tmp_path / "serving").iterdir()) == ["initial", "step-2"]
    assert all("loss" in m for m in seen)  # every step updated the adapter it then served

"""Our GRPO update vs trl.GRPOTrainer: the same model, LoRA config, prompts, group size and loss.

Single-turn prompts: MiniShop's first turn of `--prompts` train tasks (the env's real system
prompt, demonstration and first page, rendered with the chat template), `--prompts-per-step`
of them per step, G = `--group-size` completions each at temperature 1. The reward function,
the same for both: the env's one-step reward for the completion (cut at the env's stop
string, as our backend cuts it) less 0.1 for an invalid action (grpo.format_weight; the
first page's reward is 0 otherwise, so without it every group would tie). Loss for both:
dapo, epsilon 0.2 / 0.28, beta 0 (no reference pass), num_iterations 1, scale_rewards group,
AdamW at lr 1e-5.

Each trainer runs in its own child process, both at once (both see the same load on a shared
machine), and prints a line per step as it goes; the parent reports each side as it ends
and at `--time-limit` seconds cuts a side still running and reports it as a bound
(dpo_vs_trl.watch).

What is compared, per step: generation (ours: HFPolicy.sample on the model being trained;
TRL: its `_generate_and_score_completions`, generation, the reward calls and its
bookkeeping, timed by a subclass) and the update, the rest of the step (ours:
grpo/update.py's update, the pi_old forward included; TRL: forward and backward on the padded
batch, where num_iterations 1 lets it skip pi_old, and the optimizer step, timed from the
step's begin to its end less its generation). TRL's pure `_generate` is printed beside.
Update tokens/s counts each side's own trained tokens (prompt + completion of every
sequence, no padding): the completions differ between the sides. TRL runs with its own
defaults otherwise: gradient checkpointing on (ours off), no stop string (it generates to
eos or max_completion_length; ours stops at the env's).

Peak memory as in dpo_vs_trl: the kernel's high-water mark of the child's resident memory
(VmHWM) reset once the model and adapter are ready; it covers generation and update.

    PYTHONPATH=. .venv/bin/python benchmarks/grpo_vs_trl.py --steps 2
    PYTHONPATH=. .venv/bin/python benchmarks/grpo_vs_trl.py --tiny --steps 2  # a quick check
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from dpo_vs_trl import Side as PairSide
from dpo_vs_trl import emit, ready, run_sides, status

FORMAT_WEIGHT = 0.1


def first_turns(n: int, tokenizer) -> tuple[list, list[str]]:
    """(tasks, prompt texts): MiniShop's first turn of n train tasks."""
    from offline_agent.chat import history_messages, render_prompt
    from offline_agent.envs.base import load_env

    env = load_env("minishop", seed=0)
    system, demo = env.system_prompt(), env.demonstration()
    tasks = env.tasks("train", n)
    prompts = [render_prompt(tokenizer, history_messages(
        system, t.instruction, env.reset(t), [], demo)) for t in tasks]
    return tasks, prompts


class OneStep:
    """The reward function of both sides: the env's reward for one action from the first page."""

    def __init__(self):
        from offline_agent.envs.base import load_env

        self.env = load_env("minishop", seed=0)
        self.stop = self.env.stop

    def __call__(self, task, text: str) -> float:
        for s in self.stop:
            text = text.split(s)[0]
        self.env.reset(task)
        _, result = self.env.act(text)
        return result.reward - FORMAT_WEIGHT * result.invalid


def grpo_config(args):
    from offline_agent.training.grpo.config import GRPOConfig

    return GRPOConfig(group_size=args.group_size, tasks_per_step=args.prompts_per_step,
                      lr=1e-5, temperature=1.0, beta=0.0, loss_type="dapo", num_iterations=1,
                      max_resample=0)


def step_done(step: int, **data) -> None:
    import torch

    cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    emit("STEP", step=step, hwm=status("VmHWM"), cuda=cuda, **data)


def our_batch(policy, tasks, prompts, cfg, reward, step: int, max_tokens: int):
    """One step's rollouts (G completions of each prompt) as a grpo/update.py Batch."""
    import torch

    from offline_agent.policy.base import Sampling, encode_prompt
    from offline_agent.training.grpo.objective import episode_advantages
    from offline_agent.training.grpo.rollouts import Rollout, Turn
    from offline_agent.training.grpo.update import make_batch

    out = policy.sample(prompts, cfg.group_size, Sampling(
        max_new_tokens=max_tokens, temperature=1.0, stop=list(reward.stop),
        seed=[step * len(prompts) + i for i in range(len(prompts))]))
    rollouts, values = [], []
    for g, (task, prompt, completions) in enumerate(zip(tasks, prompts, out)):
        context = encode_prompt(policy.tokenizer, prompt)
        for c in completions:
            rollouts.append(Rollout(g, None, [Turn(context, list(c.token_ids), "")]))
            values.append(reward(task, c.text))
    adv = episode_advantages(torch.tensor(values), torch.tensor([r.group for r in rollouts]),
                             cfg.scale_rewards)
    return make_batch(rollouts, [a.reshape(1) for a in adv]), sum(values) / len(values)


def run_ours(args, tasks, prompts, max_tokens: int) -> None:
    import torch

    from offline_agent.policy.hf import HFPolicy
    from offline_agent.training.config import TrainConfig
    from offline_agent.training.grpo.update import update
    from offline_agent.training.model import add_lora, load_base

    cfg = grpo_config(args)
    train_cfg = TrainConfig(lora_r=args.lora_r, lora_alpha=2 * args.lora_r,
                            pack_tokens=args.pack_tokens)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load_base(args.model, train_cfg, device)
    model = add_lora(model, train_cfg)
    policy = HFPolicy(model, tok, max_batch=args.prompts_per_step * args.group_size, seed=0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    reward = OneStep()
    ready(gradient_checkpointing=train_cfg.gradient_checkpointing)
    p = args.prompts_per_step
    for step in range(args.steps):
        began = time.perf_counter()
        model.eval()
        policy.clear_cache()
        at = [(step * p + i) % len(tasks) for i in range(p)]
        batch, mean = our_batch(policy, [tasks[i] for i in at], [prompts[i] for i in at], cfg,
                                reward, step, max_tokens)
        generation = time.perf_counter() - began
        tokens = sum(len(s.ids) for s in batch.seqs)
        emit("GENERATED", seconds=generation, tokens=tokens)
        model.train()
        update(model, optimizer, batch, cfg, args.pack_tokens, max_tokens)
        step_done(step + 1, seconds=time.perf_counter() - began, generation=generation,
                  tokens=tokens, reward=mean)


def timed_trainer():
    """trl.GRPOTrainer that reports its generation (and scoring) time and trained tokens."""
    from trl import GRPOTrainer

    class Timed(GRPOTrainer):
        generate_seconds = 0.0

        def _generate(self, prompts):
            began = time.perf_counter()
            out = super()._generate(prompts)
            self.generate_seconds = time.perf_counter() - began
            return out

        def _generate_and_score_completions(self, inputs):
            began = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.scored = time.perf_counter() - began
            self.tokens = int(out["prompt_mask"].sum() + out["completion_mask"].sum())
            emit("GENERATED", seconds=self.scored, tokens=self.tokens,
                 generate=self.generate_seconds)
            return out

    return Timed


def trl_config(args, out: str, max_tokens: int, cuda: bool):
    """trl.GRPOConfig with our GRPOConfig's loss settings and the same batch."""
    from trl import GRPOConfig

    ours = grpo_config(args)
    return GRPOConfig(
        output_dir=out, per_device_train_batch_size=args.prompts_per_step * args.group_size,
        num_generations=args.group_size, max_completion_length=max_tokens,
        temperature=1.0, learning_rate=ours.lr, beta=ours.beta, epsilon=ours.epsilon,
        epsilon_high=ours.epsilon_high, loss_type=ours.loss_type,
        scale_rewards=ours.scale_rewards, num_iterations=ours.num_iterations,
        max_steps=args.steps, shuffle_dataset=False, report_to="none", save_strategy="no",
        logging_steps=1, use_cpu=not cuda, bf16=cuda, dataloader_num_workers=0, seed=0)


def run_trl(args, tasks, prompts, max_tokens: int) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from offline_agent.policy.models import resolve_model
    from offline_agent.training.config import TrainConfig

    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    cuda = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cuda else torch.float32)
    reward = OneStep()
    need = args.steps * args.prompts_per_step
    data = Dataset.from_list([{"prompt": prompts[i % len(prompts)], "task": i % len(prompts)}
                              for i in range(need)])

    def one_step_reward(prompts, completions, task, **kw):
        return [reward(tasks[t], c) for t, c in zip(task, completions)]

    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                      target_modules=TrainConfig().target_modules, task_type="CAUSAL_LM")
    began = [0.0]
    trainer_box = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            began[0] = time.perf_counter()

        def on_step_end(self, a, state, *rest, **k):
            t = trainer_box[0]
            step_done(state.global_step, seconds=time.perf_counter() - began[0],
                      generation=t.scored, generate=t.generate_seconds, tokens=t.tokens)

    with tempfile.TemporaryDirectory() as out:
        config = trl_config(args, out, max_tokens, cuda)
        trainer = timed_trainer()(model=model, reward_funcs=one_step_reward, args=config,
                                  train_dataset=data, processing_class=tok, peft_config=lora,
                                  callbacks=[Timer()])
        trainer_box.append(trainer)
        ready(gradient_checkpointing=config.gradient_checkpointing)
        trainer.train()


def child(args) -> None:
    from transformers import AutoTokenizer

    from offline_agent.envs.base import load_env
    from offline_agent.policy.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    tasks, prompts = first_turns(args.prompts, tok)
    emit("PROMPTS", tokens=[len(tok(p, add_special_tokens=False).input_ids) for p in prompts])
    max_tokens = load_env("minishop", seed=0).max_action_tokens
    (run_ours if args.child == "ours" else run_trl)(args, tasks, prompts, max_tokens)
    emit("DONE", hwm=status("VmHWM"))


class Side(PairSide):
    """What the parent knows of one child: per step its time, generation time and tokens."""

    KINDS = ("PROMPTS", "READY", "GENERATED", "STEP", "DONE")

    def __init__(self, name: str, args):  # PairSide's, running this file
        self.name, self.args = name, args
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--child", name],
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.tokens: list[int] = []
        self.rss = self.hwm = self.cuda = 0
        self.settings: dict = {}
        self.steps: list[float] = []
        self.ready_at = self.cut_after = None
        self.finished = False
        self.records: list[dict] = []
        self.current = None  # the GENERATED line of the step being updated, and when it came

    def read(self, lines) -> None:
        import json

        for line in self.proc.stdout:
            kind, _, data = line.partition(" ")
            if kind in self.KINDS:
                lines.put((self, kind, json.loads(data)))
        lines.put((self, "EOF", {}))

    def take(self, kind: str, data: dict) -> None:
        if kind == "PROMPTS":
            self.tokens = data["tokens"]
        elif kind == "GENERATED":
            self.current = (data, time.monotonic())
        elif kind == "STEP":
            self.records.append(data)
            self.current = None
        if kind in ("READY", "STEP", "DONE"):
            super().take(kind, data)

    def result(self) -> dict:
        """Update tokens/s (each side's own tokens over its update seconds), whole-step and
        generation seconds; cut in an update: its tokens and elapsed seconds count, a bound."""
        peak = self.hwm - self.rss if self.hwm else 0
        tokens = sum(r["tokens"] for r in self.records)
        update = sum(r["seconds"] - r["generation"] for r in self.records)
        bound = self.cut_after is not None
        if bound and self.current is not None:
            tokens += self.current[0]["tokens"]
            update += time.monotonic() - self.current[1]
        n = max(len(self.records), 1)
        return {"tps": tokens / max(update, 1e-9) if update else 0.0, "bound": bound,
                "peak": peak, "s_step": sum(r["seconds"] for r in self.records) / n,
                "generation": sum(r["generation"] for r in self.records) / n,
                "update": update / max(len(self.records) + (self.current is not None), 1)}

    def line(self) -> str:
        r = self.result()
        gc = "on" if self.settings.get("gradient_checkpointing") else "off"
        pure = [x["generate"] for x in self.records if "generate" in x]
        pure = f" (of which _generate {sum(pure) / len(pure):.1f} s)" if pure else ""
        cut = (f"CUT at the time limit after {len(self.records)} of {self.args.steps} steps: "
               if r["bound"] else f"{len(self.records)} steps: ")
        rel = "<=" if r["bound"] else ""
        return (f"{self.name:>5}: {cut}update {rel}{r['tps']:.0f} tokens/s ({r['update']:.1f} "
                f"s/step), generation {r['generation']:.1f} s/step{pure}, whole step "
                f"{r['s_step']:.1f} s; peak {r['peak'] / 2**20:.0f} MiB above ready (VmHWM "
                f"{self.hwm / 2**20:.0f} MiB); gradient checkpointing {gc}; mean reward "
                f"{_mean([x.get('reward') for x in self.records])}")


def _mean(values) -> str:
    values = [v for v in values if v is not None]
    return f"{sum(values) / len(values):.3f}" if values else "n/a (TRL logs it)"


def tiny_model_dir(folder: str) -> str:
    """A 2-layer random Llama on the embedded tokenizer, saved for both children."""
    from transformers import AutoTokenizer

    from offline_agent.envs.testing.grammar_check import tiny_model
    from offline_agent.policy.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("embedded:smollm2-135m-instruct"))
    tiny_model(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--tiny", action="store_true",
                    help="a 2-layer random Llama on the embedded tokenizer (a quick check)")
    ap.add_argument("--prompts", type=int, default=8, help="distinct MiniShop first turns")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--pack-tokens", type=int, default=3072)
    ap.add_argument("--time-limit", type=float, default=900.0,
                    help="seconds after which a side still running is cut and reported as a bound")
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as folder:
        if args.tiny:
            sys.argv += ["--model", tiny_model_dir(folder)]
        print(f"{args.prompts_per_step} MiniShop first turns x G={args.group_size} per step, "
              f"{args.steps} steps, LoRA r={args.lora_r}, time limit {args.time_limit:.0f} s; "
              f"{os.cpu_count()} CPUs, both trainers at once", flush=True)
        sides = [Side("ours", args), Side("trl", args)]
        run_sides(sides, args.time_limit)
    mean = sum(sides[0].tokens) / max(len(sides[0].tokens), 1)
    print(f"{mean:.0f} prompt tokens per first turn")
    print(ratio(sides[0].result(), sides[1].result()))


def ratio(ours: dict, trl: dict) -> str:
    """ours/trl update tokens/s and peak memory, with >= / <= where a side was cut."""
    if ours["bound"] and trl["bound"]:
        return "both sides cut: no ratio"
    speed = ">=" if trl["bound"] else "<=" if ours["bound"] else "="
    memory = "<=" if trl["bound"] else ">=" if ours["bound"] else "="
    return (f"update speed: ours/trl {speed} {ours['tps'] / max(trl['tps'], 1e-9):.2f}x "
            f"tokens/s; memory: ours/trl {memory} {ours['peak'] / max(trl['peak'], 1):.2f}x "
            f"peak; generation: ours/trl {ours['generation'] / max(trl['generation'], 1e-9):.2f}x "
            f"s/step")


if __name__ == "__main__":
    main()

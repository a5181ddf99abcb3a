"""Where the time goes: the backend's peak tokens/s, and the same counters inside one real
search, one greedy eval and one DPO step, each with the share of peak it reaches.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/throughput.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/throughput.py --quick  # smaller stages
    .venv/bin/python benchmarks/throughput.py --profile     # + torch.profiler top ops

1. Peak, on the embedded model (float32, CPU), with real MiniShop prompts: a prefill of one
   and of 8 first-turn prompts (what search and eval send first), a short suffix (one more
   action and observation) after 8 cached prompts (every later turn), decode steps at batch
   1/8/16/32 at the context of a deep step, and one LoRA training forward+backward.
2. Stages, measured from outside (benchmarks/_counters.py: forward hooks on the model,
   wrappers on the policy's calls and on the env, tokenizer and store methods), so the same
   script measures the code before and after a change: MCTS search (offline_agent.search
   Searcher, with the critic, writing to a DuckDB store as the search stage does), greedy
   eval (evaluation.greedy_episodes at the backend's max_batch, episodes stored), and DPO on
   step pairs (reference pass, then one optimizer step of trainer.train).

Per stage: tokens prefilled (real; pad counted apart), decoded, needed (what a prefix cache
that never evicts would have computed: every distinct prefix once), recomputed (forwarded
beyond that), decode occupancy (rows alive per decode step over the backend's max_batch
slots), and the wall time split into exclusive parts: in the model (forward; backward and
optimizer for training), in the policy backend around it, tokenizer and chat template, env,
DuckDB, and the rest (search/rollout Python). "share" is the stage's forwarded tokens/s over
the best peak forward tokens/s (the training peak for the DPO step); "mix share" is the time
the stage's prefill and decode tokens would take at the best prefill and decode peaks, over
its wall time. The last line is all figures as JSON (diff two runs).

The default run took 721 s on the 2-core machine while other jobs kept its load average
at 5.7-6.6 (so every figure there is pessimistic, the peaks included). Timings are
wall-clock, each taken once (peaks: best of --reps). With other processes on
the machine only ratios measured in one run are trustworthy; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _counters import Watch
from minishop_pairs import step_pairs

from offline_agent.chat import render_prompt
from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.policy.base import encode_prompt
from offline_agent.policy.kv_buffer import new_cache
from offline_agent.training.logprobs import encode_pair, messages, pack

MAX_STEPS = 8  # MiniShop episode limit, as configs/default.yaml


def make_env():
    return load_env("minishop", max_steps=MAX_STEPS)


# ---- 1. peak -------------------------------------------------------------------------------------
def note(text: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def best_seconds(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def prompt_ids(tokenizer, pairs: list[dict]) -> list[list[int]]:
    """Ids of the rendered prompts of step pairs (MiniShop states of depth 0-3)."""
    return [encode_prompt(tokenizer, render_prompt(tokenizer, messages(p["prompt"])))
            for p in pairs]


@torch.inference_mode()
def prefill_rate(model, rows: list[list[int]], reps: int) -> float:
    ids = torch.tensor(rows)
    return ids.numel() / best_seconds(lambda: model(ids, use_cache=False, logits_to_keep=1), reps)


@torch.inference_mode()
def suffix_rate(model, rows: list[list[int]], prefix: int, reps: int) -> float:
    """Prefill of rows[:, prefix:] with rows[:, :prefix] already in the KV cache."""
    ids = torch.tensor(rows)
    cache = new_cache(model.config.num_hidden_layers)
    model(ids[:, :prefix], cache=cache, logits_to_keep=1)

    def step():
        model(ids[:, prefix:], cache=cache, logits_to_keep=1)
        cache.crop(-(ids.shape[1] - prefix))  # transformers 5: the number of tokens to drop
    return ids[:, prefix:].numel() / best_seconds(step, reps)


@torch.inference_mode()
def context_kv(model, context: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of `context` per layer, [1, kv heads, len(context), dim] each."""
    cache = new_cache(model.config.num_hidden_layers)
    model(torch.tensor([context]), cache=cache, logits_to_keep=1)
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


@torch.inference_mode()
def decode_rate(model, kv, last: int, batch: int, steps: int, reps: int) -> float:
    """Decode steps of `batch` rows, each with the context `kv` (context_kv) in its cache."""
    filled = kv[0][0].shape[2]

    def fresh():
        return new_cache(model.config.num_hidden_layers,
                         [(torch.cat([k.expand(batch, -1, -1, -1), k.new_zeros(
                             batch, k.shape[1], steps, k.shape[3])], 2),
                           torch.cat([v.expand(batch, -1, -1, -1), v.new_zeros(
                             batch, v.shape[1], steps, v.shape[3])], 2)) for k, v in kv],
                         filled=filled)
    token = torch.full((batch, 1), last)
    best = float("inf")
    for _ in range(reps):
        cache = fresh()  # untimed: a copy of the context per row, with room for the steps
        start = time.perf_counter()
        for _ in range(steps):
            model(token, cache=cache)
        best = min(best, time.perf_counter() - start)
        del cache
    return batch * steps / best


def train_rate(model, row: list[int], reps: int) -> float:
    """Forward + backward of one causal row through the LoRA model, 32 rows of logits (DPO
    keeps only the rows that predict action tokens)."""
    ids = torch.tensor([row])
    model.train()

    def step():
        model(input_ids=ids, use_cache=False, logits_to_keep=32).logits.logsumexp(-1).sum().backward()
        model.zero_grad(set_to_none=True)
    return len(row) / best_seconds(step, reps)


def peaks(policy, lora, pairs, args) -> dict:
    tok, model = policy.tokenizer, policy.model
    ids = prompt_ids(tok, pairs)
    first = [ids[i] for i in range(len(ids)) if i % 4 == 0] or ids[:1]  # depth-0 prompts
    length = min(map(len, first))
    eight = [(first * 8)[i][:length] for i in range(8)]
    deep = max(ids, key=len)
    suffix = max(1, round(statistics.mean(len(ids[i + 1]) - len(ids[i])
                                          for i in range(len(ids) - 1) if i % 4 < 3)))
    shapes = {"prompt_tokens": length, "suffix_tokens": suffix, "decode_context": len(deep)}
    prefill_rate(model, [deep[:64]], 1)  # warm-up: the first forward and backward are slower
    train_rate(lora, deep[:64], 1)
    out = {f"prefill_b1_{length}": prefill_rate(model, eight[:1], args.reps),
           f"prefill_b8_{length}": prefill_rate(model, eight, args.reps)}
    long = [r + r[:suffix] for r in eight]  # same length; the suffix tokens are real ids
    out[f"suffix_b8_{suffix}_after_{length}"] = suffix_rate(model, long, length, args.reps)
    note(f"peak: prefill and suffix done {out}")
    kv = context_kv(model, deep[:-1])
    for batch in (1, 8, 16, 32):
        out[f"decode_b{batch}_ctx{len(deep)}"] = decode_rate(model, kv, deep[-1], batch,
                                                             args.decode_steps, args.reps)
    del kv
    note(f"peak: decode done {out}")
    out[f"train_fwd_bwd_{length}"] = train_rate(lora, first[0][:length], args.reps)
    return {"shapes": shapes, "tokens_per_s": out}


# ---- 2. stages ------------------------------------------------------------------------------------
def inference_watch(policy):
    from storage import Store

    tok_class = type(policy.tokenizer)
    methods = [(tok_class, name, "tokenizer") for name in
               ("__call__", "encode", "decode", "batch_decode", "apply_chat_template")]
    return Watch(policy.model, policy=policy, methods=methods,
                 timed=[(type(make_env()), "env"), (Store, "duckdb")])


def search_stage(policy, args) -> tuple[Watch, dict]:
    from offline_agent.search.config import SearchConfig
    from offline_agent.search.frozen_critic import FrozenCritic
    from offline_agent.search.mcts import Tree
    from offline_agent.search.persist import round_tree_ids
    from offline_agent.search.searcher import Searcher
    from pipelines.stages.search import TreeWriter
    from storage import Store

    tasks = make_env().tasks("train", args.trees)
    cfg = SearchConfig(simulations=args.simulations, k=3, oversample=2, max_depth=6,
                       trees_per_batch=args.trees)
    critic = FrozenCritic(policy, make_env())
    policy.clear_cache()
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "run.duckdb") as store:
        store.insert_tasks(tasks, "tasks")
        writer = TreeWriter(store, "search", round_tree_ids(store.task_index(), 1),
                            cfg.simulations, {})
        with inference_watch(policy) as watch:
            trees = [Tree.new(t, make_env()) for t in tasks]
            writer.create(trees)
            stats = Searcher(policy, make_env, cfg, critic).run(trees, writer.commit,
                                                                progress=False)
    return watch, {"trees": args.trees, "simulations": args.simulations,
                   "nodes": stats["nodes"], "nodes_per_s": stats["nodes"] / watch.wall}


def eval_stage(policy, args) -> tuple[Watch, dict]:
    from offline_agent.evaluation import MODE, episode_row, greedy_episodes
    from storage import Store

    tasks = make_env().tasks("test", args.episodes)
    policy.clear_cache()
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "run.duckdb") as store:
        store.insert_tasks(tasks, "tasks")
        with inference_watch(policy) as watch:
            trajs = greedy_episodes(
                policy, make_env, tasks, batch_size=policy.max_batch,
                on_done=lambda t: store.insert_eval_episodes([episode_row(t, "base", MODE)],
                                                             "eval"))
    steps = sum(len(t.steps) for t in trajs)
    return watch, {"episodes": len(trajs), "steps": steps,
                   "s_per_episode": watch.wall / len(trajs)}


def dpo_stages(lora, tokenizer, args) -> list[tuple[str, Watch, dict]]:
    """The reference pass and one optimizer step on `args.pairs` step pairs."""
    from accelerate import Accelerator
    from peft import PeftModel

    from offline_agent.training.config import TrainConfig
    from offline_agent.training.dpo import DPOObjective, reference_logps
    from offline_agent.training.trainer import train

    cfg = TrainConfig(batch_size=args.pairs, max_steps=1, epochs=1, save_every=10**6)
    tokenize = [(type(tokenizer), name, "tokenizer") for name in ("__call__", "apply_chat_template")]
    with Watch(lora, methods=tokenize) as ref_watch:  # the PeftModel: what the trainer calls
        items = [list(encode_pair(tokenizer, p)) for p in step_pairs(args.pairs)]
        reference = reference_logps(lora, items, cfg.pack_tokens)
    info = {"pairs": args.pairs, "sequence_tokens": sum(len(s.ids) for seqs in items for s in seqs),
            "step_trie_tokens": len(pack([s for seqs in items for s in seqs]).ids[0])}
    metrics = {}
    methods = [(torch.Tensor, "backward", "backward"), (torch.optim.AdamW, "step", "optimizer"),
               (PeftModel, "save_pretrained", "io")]
    with tempfile.TemporaryDirectory() as folder, Watch(lora, methods=methods) as step_watch:
        train(lora, DPOObjective(items, reference, cfg), cfg, Path(folder), Accelerator(),
              on_metrics=lambda s, m: metrics.update(m))
    step = {"loss": metrics["loss"], "trainer_seconds": metrics["seconds"]}
    return [("dpo reference", ref_watch, info), ("dpo step", step_watch, step)]


# ---- figures and tables -------------------------------------------------------------------------
def stage_figures(watch: Watch, extra: dict, peak: dict, training: bool, max_batch: int) -> dict:
    c, wall = watch.counts, watch.wall
    rates = peak["tokens_per_s"]
    best_prefill = max(v for k, v in rates.items() if k.startswith(("prefill", "suffix")))
    best_decode = max(v for k, v in rates.items() if k.startswith("decode"))
    train_peak = next(v for k, v in rates.items() if k.startswith("train"))
    rate = c.forwarded / wall
    ideal = (c.forwarded / train_peak if training
             else c.prefill_tokens / best_prefill + c.decode_tokens / best_decode)
    seconds = watch.seconds()
    inside = seconds.get("model", 0.0) + seconds.get("backward", 0.0)
    return {
        "wall_s": wall, "prefill_calls": c.prefill_calls, "prefill_tokens": c.prefill_tokens,
        "pad_slots": c.pad_slots, "decode_steps": c.decode_steps, "decode_tokens": c.decode_tokens,
        "needed_tokens": c.needed, "recomputed_tokens": c.recomputed,
        "policy_calls": c.calls, "generated_tokens": c.generated,
        "occupancy": (statistics.mean(c.decode_rows) / max_batch) if c.decode_rows else None,
        "mean_decode_rows": statistics.mean(c.decode_rows) if c.decode_rows else None,
        "forward_tokens_per_s": rate,
        "prefill_tokens_per_s_in_model": c.prefill_tokens / c.prefill_seconds
        if c.prefill_seconds else None,
        "decode_tokens_per_s_in_model": c.decode_tokens / c.decode_seconds
        if c.decode_seconds else None,
        "share_of_peak": rate / (train_peak if training else best_prefill),
        "mix_share": ideal / wall, "outside_model_s": wall - inside,
        "seconds": seconds, **extra,
    }


def fmt(x, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def print_tables(peak: dict, stages: dict) -> None:
    print(f"\npeak (shapes: {peak['shapes']})")
    for name, rate in peak["tokens_per_s"].items():
        print(f"  {name:34s} {rate:9,.0f} tokens/s")
    head = (f"{'stage':14s} {'wall s':>7s} {'prefill':>8s} {'pad':>7s} {'decode':>7s} "
            f"{'needed':>8s} {'recomp':>8s} {'recomp%':>7s} {'occup':>6s} {'fwd t/s':>8s} "
            f"{'share':>6s} {'mix':>6s}")
    print("\ntokens (prefill/pad/decode: forwarded; needed: a never-evicting prefix cache's; "
          "recomp: forwarded beyond needed)")
    print(head)
    for name, s in stages.items():
        recomp = s["recomputed_tokens"] / s["forwarded"] if s["forwarded"] else 0
        print(f"{name:14s} {s['wall_s']:7.1f} {s['prefill_tokens']:8,d} {s['pad_slots']:7,d} "
              f"{s['decode_tokens']:7,d} {s['needed_tokens']:8,d} {s['recomputed_tokens']:8,d} "
              f"{recomp:7.0%} {fmt(s['occupancy'], '6.0%'):>6s} "
              f"{s['forward_tokens_per_s']:8,.0f} {s['share_of_peak']:6.1%} {s['mix_share']:6.1%}")
    parts = ["model", "backward", "optimizer", "policy", "tokenizer", "env", "duckdb", "io",
             "other"]
    print("\nwall time split (exclusive; model = forwards; policy = backend code around them)")
    print(f"{'stage':14s} " + " ".join(f"{p:>9s}" for p in parts) + f" {'outside':>9s}")
    for name, s in stages.items():
        cells = [f"{s['seconds'].get(p, 0.0) / s['wall_s']:9.0%}" for p in parts]
        print(f"{name:14s} " + " ".join(cells) + f" {s['outside_model_s'] / s['wall_s']:9.0%}")
    print("\nin-model rates (tokens/s inside forwards): "
          + "; ".join(f"{n}: prefill {fmt(s['prefill_tokens_per_s_in_model'])}, decode "
                      f"{fmt(s['decode_tokens_per_s_in_model'])}" for n, s in stages.items()))


def profile(policy, context: list[int]) -> None:
    """torch.profiler's top ops of one decode step at batch 16 and of one prefill."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = policy.model
    with torch.inference_mode():
        cache = new_cache(model.config.num_hidden_layers)
        model(torch.tensor([context]), cache=cache, logits_to_keep=1)
        cache.batch_repeat_interleave(16)
        token = torch.full((16, 1), context[-1])
        model(token, cache=cache)
        with torch_profile(activities=[ProfilerActivity.CPU]) as decode:
            model(token, cache=cache)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prefill:
            model(torch.tensor([context]), use_cache=False, logits_to_keep=1)
    for name, prof in ((f"decode step, batch 16, context {len(context)}", decode),
                       (f"prefill, batch 1, {len(context)} tokens", prefill)):
        print(f"\ntorch.profiler: {name}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=4, help="MiniShop trees searched together")
    ap.add_argument("--simulations", type=int, default=2, help="MCTS simulations per tree")
    ap.add_argument("--episodes", type=int, default=16, help="greedy eval episodes (test tasks)")
    ap.add_argument("--pairs", type=int, default=8, help="step pairs of the DPO step")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each peak shape (best)")
    ap.add_argument("--decode-steps", type=int, default=8, help="decode steps per peak timing")
    ap.add_argument("--quick", action="store_true",
                    help="2 trees x 1 simulation, 8 episodes, 4 pairs, 1 rep: under ~3 min")
    ap.add_argument("--stages", default="search,eval,dpo", help="stages to run, comma-separated")
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler top ops")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.quick:
        args.trees, args.simulations, args.episodes, args.pairs, args.reps = 2, 1, 8, 4, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, load average at start "
          f"{os.getloadavg()[0]:.1f}")
    from offline_agent.training.config import TrainConfig
    from offline_agent.training.model import add_lora, load_base

    policy = load_policy(DEFAULT_MODEL, device="cpu", dtype="float32")
    lora_cfg = TrainConfig()
    lora, train_tok = load_base(DEFAULT_MODEL, lora_cfg, "cpu")
    lora = add_lora(lora, lora_cfg)
    pairs = step_pairs(8)
    peak = peaks(policy, lora, pairs, args)
    wanted = args.stages.split(",")
    runs: list[tuple[str, Watch, dict]] = []
    note(f"peak done {peak}")
    if "search" in wanted:
        runs.append(("search", *search_stage(policy, args)))
        note(f"search done in {runs[-1][1].wall:.0f} s")
    if "eval" in wanted:
        runs.append(("eval", *eval_stage(policy, args)))
        note(f"eval done in {runs[-1][1].wall:.0f} s")
    if "dpo" in wanted:
        runs += dpo_stages(lora, train_tok, args)
    stages = {}
    for name, watch, extra in runs:
        figures = stage_figures(watch, extra, peak, name == "dpo step", policy.max_batch)
        stages[name] = {**figures, "forwarded": watch.counts.forwarded}
    print_tables(peak, stages)
    if args.profile:
        profile(policy, prompt_ids(policy.tokenizer, pairs)[0])
    load = os.getloadavg()[0]
    print(f"\nload average at end {load:.1f}; total {time.perf_counter() - began:.0f} s")
    print("JSON " + json.dumps(rounded({"args": vars(args), "threads": torch.get_num_threads(),
                                        "load_end": load, "peak": peak, "stages": stages})))


def rounded(x):
    """Floats to 4 significant digits, all the way down (the JSON line stays short)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


if __name__ == "__main__":
    main()

"""Token drift: do the ids training uses for an action equal the ids the policy generated?

A real run on the embedded model (configs/default.yaml: tasks, greedy baseline, search on a
few MiniShop train tasks, into a real store) with every `policy.sample` call recorded: the
prompt, the action's text and the ids the policy generated (Completion.token_ids). Then each
generated action the store holds is encoded as training encodes it, from the stored rows:
- node actions (what step DPO trains on): `encode_prompt_completion(history, [action])`;
- episode actions (search rollouts and greedy episodes, what outcome DPO and RFT train on):
  `encode_prompt_completion(prompt, whole episode)`, one masked run per action.
The masked span is compared with the recorded ids of that text at that prompt. An action cut
at a stop string ends without the end-of-turn token training appends (the template closes
the turn), so its span is compared without it. Side by side, the same actions encoded the
way training did before, from their text alone (the stored ids dropped).

Categories: `same`; `stop inside a token` (a stop string began inside the last generated
token: that token is not the action's, so the action ends in the tokenizer's ids of the rest
of its text, by design, see Completion.action_ids); `differs`. Env-listed actions (search
lists MiniShop's clickable actions) were never generated and are counted apart.

    nice -n 10 .venv/bin/python benchmarks/token_drift.py --tasks 4 --simulations 3
    nice -n 10 .venv/bin/python benchmarks/token_drift.py --run-dir RUN_DIR  # a finished run
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter, defaultdict

import offline_agent.policy as policies  # noqa: E402
from offline_agent.chat import encode_prompt_completion, mask_runs, render_prompt  # noqa: E402
from offline_agent.envs.base import load_env  # noqa: E402
from offline_agent.mining.build import Context, episode_messages, node_step, path_steps  # noqa: E402
from offline_agent.policy.base import encode_prompt  # noqa: E402
from offline_agent.training.logprobs import messages  # noqa: E402
from offline_agent.types import Message, step_from_dict  # noqa: E402
from pipelines.config import RunConfig  # noqa: E402
from pipelines.runner import run  # noqa: E402
from pipelines.stages import STAGES  # noqa: E402
from storage import Store  # noqa: E402

RECORDED: dict[tuple[str, str], list[list[int]]] = defaultdict(list)  # (prompt, text) -> ids
POLICY = []


def recording(load):
    """load_policy whose policy records every completion it samples."""
    def load_recording(*args, **kwargs):
        policy = load(*args, **kwargs)
        sample = policy.sample

        def sample_and_record(prompts, n, sampling):
            out = sample(prompts, n, sampling)
            for prompt, completions in zip(prompts, out):
                for c in completions:
                    RECORDED[(prompt, c.text)].append(list(c.token_ids))
            return out

        policy.sample = sample_and_record
        POLICY.append(policy)
        return policy
    return load_recording


def classify(tok, eos: set[int], span: list[int], text: str, generated: list[list[int]]) -> str:
    """How the trained span of `text` relates to the ids generated for it at its prompt."""
    if not generated:
        return "not recorded"
    for ids in generated:
        ended = bool(ids) and ids[-1] in eos
        if (span if ended else span[:-1]) == ids:
            return "same"
    if any(tok.decode(ids, clean_up_tokenization_spaces=False) != text for ids in generated):
        return "stop inside a token"
    return "differs"


def strip(msgs: list[Message]) -> list[Message]:
    return [Message(m.role, m.content) for m in msgs]


def node_actions(store: Store, ctx: Context, tok, eos, lookup,
                 counts: dict[str, Counter]) -> None:
    """Every searched node: the step-DPO encoding of its action after its history."""
    tasks = {t.id: t for t in store.tasks("train")}
    trees = store.trees()
    nodes = {r.node_id: r for r in store.tree_edges([t.tree_id for t in trees])}
    task_of = {t.tree_id: t.task_id for t in trees}
    for row in nodes.values():
        if row.parent_id is None:
            continue
        if row.token_ids is None:
            counts["nodes"]["env-listed (not generated)"] += 1
            continue
        first, steps = path_steps(nodes, row.parent_id)
        prompt = messages(ctx.messages(tasks[task_of[row.tree_id]].instruction, first, steps))
        step = node_step(row)
        rendered = render_prompt(tok, prompt)
        for key, completion in (("nodes", Message("assistant", step.action,
                                                  token_ids=step.token_ids)),
                                ("nodes, text only", Message("assistant", step.action))):
            ids, mask = encode_prompt_completion(tok, prompt, [completion])
            start = mask.index(1)
            counts[key][classify(tok, eos, ids[start:start + sum(mask)], step.action,
                                 lookup(rendered, step))] += 1
            counts[key]["prompt ids differ"] += ids[:start] != encode_prompt(tok, rendered)


def episode_actions(store: Store, ctx: Context, make_env, tok, eos, lookup,
                    counts: dict[str, Counter]) -> None:
    """Every stored episode (search rollouts, greedy baseline): the outcome-DPO encoding of
    the whole episode after its prompt, one masked run per action."""
    tasks = {t.id: t for t in store.tasks("train")}
    for traj in store.trajectories():
        task = tasks[traj.task_id]
        steps = [step_from_dict(s) for s in traj.steps]
        prompt, rest = episode_messages(ctx, task.instruction, make_env().reset(task), steps)
        prompt, rest = messages(prompt), messages(rest)
        full = prompt + rest
        turns = [i for i, m in enumerate(full) if m.role == "assistant" and i >= len(prompt)]
        for key, completion in (("episodes", rest), ("episodes, text only", strip(rest))):
            ids, mask = encode_prompt_completion(tok, prompt, completion)
            for (start, end), i, step in zip(mask_runs(mask), turns, steps):
                if step.token_ids is None:
                    counts[key]["env-listed (not generated)"] += 1
                    continue
                rendered = render_prompt(tok, full[:i])
                counts[key][classify(tok, eos, ids[start:end], step.action,
                                     lookup(rendered, step))] += 1
                # later turns: context holds earlier actions as trained (see chat.py)
                counts[key]["context ids differ"] += ids[:start] != encode_prompt(tok, rendered)


def measure(cfg: RunConfig, run_dir: str, tok, eos: set[int], lookup) -> dict[str, Counter]:
    """Counts per encoding of every generated action the run's store holds."""
    def make_env():  # a fresh one per episode, as the stages make them
        return load_env(cfg.env.name, seed=cfg.run.seed, **cfg.env.kwargs)

    ctx = Context(make_env().system_prompt(), make_env().demonstration())
    counts: dict[str, Counter] = defaultdict(Counter)
    with Store(f"{run_dir}/store.duckdb", read_only=True) as store:
        node_actions(store, ctx, tok, eos, lookup, counts)
        episode_actions(store, ctx, make_env, tok, eos, lookup, counts)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4, help="MiniShop train tasks searched")
    ap.add_argument("--simulations", type=int, default=3)
    ap.add_argument("--run-dir", help="measure this finished run's store instead (no new run): "
                    "the generated ids are then the stored ones, sampling was not recorded")
    args = ap.parse_args()
    if args.run_dir:
        from transformers import AutoTokenizer

        cfg = RunConfig.load(f"{args.run_dir}/config.yaml")
        tok = AutoTokenizer.from_pretrained(policies.resolve_model(cfg.model.id))
        counts = measure(cfg, args.run_dir, tok, {tok.eos_token_id},
                         lambda rendered, step: [step.token_ids])
        print(f"the stored actions of {args.run_dir}, against their stored ids")
    else:
        policies.load_policy = recording(policies.load_policy)
        with tempfile.TemporaryDirectory() as run_dir:
            cfg = RunConfig.load("configs/default.yaml", [
                f"env.train_tasks={args.tasks}", "env.test_tasks=1",
                f"search.simulations={args.simulations}", f"search.trees_per_batch={args.tasks}"])
            run(cfg, run_dir, STAGES, until="search")
            counts = measure(cfg, run_dir, POLICY[0].tokenizer, set(POLICY[0].eos),
                             lambda rendered, step: RECORDED[(rendered, step.action)])
        print(f"{sum(map(len, RECORDED.values()))} sampled completions recorded; "
              f"search on {args.tasks} MiniShop train tasks x {args.simulations} simulations "
              f"(configs/default.yaml) + greedy baseline, embedded model")
    for key, c in counts.items():
        generated = sum(v for k, v in c.items() if k in ("same", "stop inside a token",
                                                         "differs", "not recorded"))
        print(f"{key:22s} generated actions {generated:4d}: mismatch rate "
              f"{1 - c['same'] / max(generated, 1):.4f}  {dict(c)}")


if __name__ == "__main__":
    main()

"""Batched MCTS driver: many trees advance together so one generate call serves them all.

Each active tree runs one simulation generator (offline_agent.search.mcts.simulate). At
every tick the driver gathers the pending requests of all trees, serves every action they ask
for (K proposals, greedy or sampled, and rollout steps alike) in one `policy.sample` call
with per-row temperatures and seeds, the rankings of available actions (`rank_available`)
and the critiques in one batched scoring each, and sends the answers back. The backend
computes a prompt repeated K times once. A tree whose simulation ends starts its next one
at once (continuous batching); a finished tree hands its slot to the next task. Finished
simulations are handed to `commit` after every tick, which is what makes a crash lose at
most the simulations in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

from tqdm.auto import tqdm

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.base import Env
from offline_agent.policy.base import Policy, Sampling
from offline_agent.search.config import SearchConfig
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.mcts import SimulationResult, Tree, simulate
from offline_agent.search.requests import Critique, Rank, Sample
from offline_agent.seeding import stable_seed

Commit = Callable[[list[tuple[Tree, SimulationResult]]], None]


@dataclass
class _Slot:
    tree: Tree
    env: Env
    sim: Generator | None = None  # the simulation in progress
    request: Sample | Rank | Critique | None = None  # what it waits for; None once the tree is done


def sample_prompt(policy: Policy, env: Env, request: Sample | Rank) -> str:
    messages = history_messages(env.system_prompt(), request.task.instruction,
                                request.first_observation, request.steps, env.demonstration())
    return render_prompt(policy.tokenizer, messages)


def rank_available(policy: Policy, env: Env, requests: list[Rank]) -> list[list[list[float]]]:
    """Two rankings of each request's actions: [task PMI, log p(action | task, history)].

    The PMI, log p(action | task, history) - log p(action | history with no instruction), ranks
    by what the task adds (at a MiniShop product page: the option the instruction names, which
    raw log-probs put behind the option the page lists first), as in Holtzman et al. 2021's
    domain-conditional PMI. The log-prob ranks by what the policy would write (after an option
    click: `buy`, which its samples there often miss). Both prompts extend ones the prefix
    cache holds (the no-task one extends the parent node's)."""
    blind = [replace(r, task=replace(r.task, instruction="")) for r in requests]
    prompts = [sample_prompt(policy, env, r) for r in [*requests, *blind]]
    logprobs = policy.choice_logprobs(prompts, [r.actions for r in requests] * 2)
    n = len(requests)
    return [[[a - b for a, b in zip(logprobs[i], logprobs[n + i])], logprobs[i]]
            for i in range(n)]


class Searcher:
    def __init__(self, policy: Policy, make_env: Callable[[], Env], cfg: SearchConfig,
                 critic: FrozenCritic | None = None):
        if cfg.leaf_value != "rollout" and critic is None:
            raise ValueError(f"search.leaf_value {cfg.leaf_value} needs a critic, got None")
        self.policy, self.make_env, self.cfg, self.critic = policy, make_env, cfg, critic
        self.probe = make_env()  # renders prompts; the system prompt and demo are per env
        self.stop, self.max_tokens = list(self.probe.stop), self.probe.max_action_tokens

    def run(self, trees: list[Tree], commit: Commit, progress: bool = True) -> dict[str, float]:
        """Search every tree up to `cfg.simulations`; returns throughput stats."""
        cfg = self.cfg
        queue = [t for t in trees if t.simulations_done < cfg.simulations]
        total = sum(cfg.simulations - t.simulations_done for t in queue)
        bar = tqdm(total=total, desc="search", unit="sim", disable=not progress)
        slots: list[_Slot] = []
        free_envs = [self.make_env() for _ in range(min(cfg.trees_per_batch, len(queue)))]
        nodes_before = sum(len(t.nodes) for t in trees)
        solved: set[str] = set()
        start = time.perf_counter()

        while queue or slots:
            finished: list[tuple[Tree, SimulationResult]] = []
            while queue and free_envs:  # fill free slots with waiting trees
                slot = _Slot(tree=queue.pop(0), env=free_envs.pop())
                finished += self._advance(slot, None)
                slots.append(slot)
            live = [s for s in slots if s.request is not None]
            for slot, answer in zip(live, self._serve([s.request for s in live])):
                finished += self._advance(slot, answer)
            if finished:
                commit(finished)
                bar.update(len(finished))
                solved |= {t.task.id for t, r in finished if r.trajectory.success}
            free_envs += [s.env for s in slots if s.request is None]
            slots = [s for s in slots if s.request is not None]
            new_nodes = sum(len(t.nodes) for t in trees) - nodes_before
            rate = new_nodes / (time.perf_counter() - start)
            bar.set_postfix(trees_left=len(queue) + len(slots), nodes_s=f"{rate:.2f}",
                            solved=len(solved))
        bar.close()
        elapsed = time.perf_counter() - start
        new_nodes = sum(len(t.nodes) for t in trees) - nodes_before
        return {"seconds": elapsed, "nodes": new_nodes, "nodes_per_s": new_nodes / max(elapsed, 1e-9),
                "simulations": total, "tasks_solved": len(solved)}

    def _advance(self, slot: _Slot, answer) -> list[tuple[Tree, SimulationResult]]:
        """Feed `answer` to the slot's simulation (start one if None) until it asks again.

        A simulation can end without asking anything (it selected a terminal node), so
        this loops, starting the tree's next simulation each time one ends.
        """
        done = []
        while True:
            try:
                if slot.sim is None:
                    slot.sim = simulate(slot.tree, slot.env, self.cfg, self.critic is not None)
                    slot.request = next(slot.sim)
                else:
                    slot.request = slot.sim.send(answer)
                return done
            except StopIteration as stop:
                done.append((slot.tree, stop.value))
                slot.sim, slot.request = None, None
                if slot.tree.simulations_done >= self.cfg.simulations:
                    return done

    def _serve(self, requests: list[Sample | Rank | Critique]) -> list[list]:
        """Answer all pending requests: one sample call for every action, one scoring call for
        the rankings, one for the critiques."""
        answers: list[list] = [[] for _ in requests]
        rows = [(i, j) for i, req in enumerate(requests) if isinstance(req, Sample)
                for j in range(req.n)]
        if rows:
            prompts = {i: sample_prompt(self.policy, self.probe, requests[i]) for i, _ in rows}
            sampling = Sampling(max_new_tokens=self.max_tokens, stop=self.stop,
                                temperature=[requests[i].temperatures[j] for i, j in rows],
                                seed=[stable_seed(requests[i].seed, j) for i, j in rows],
                                tools=[requests[i].tools for i, _ in rows])
            completions = self.policy.sample([prompts[i] for i, _ in rows], 1, sampling)
            for (i, _), (completion,) in zip(rows, completions):
                answers[i].append((completion.text, completion.action_ids))
        ranks = [i for i, req in enumerate(requests) if isinstance(req, Rank)]
        if ranks:
            rankings = rank_available(self.policy, self.probe, [requests[i] for i in ranks])
            for i, scores in zip(ranks, rankings):
                answers[i] = scores
        critiques = [i for i, req in enumerate(requests) if isinstance(req, Critique)]
        if critiques:
            assert self.critic is not None
            for i, scores in zip(critiques, self.critic.score([requests[i] for i in critiques])):
                answers[i] = scores
        return answers

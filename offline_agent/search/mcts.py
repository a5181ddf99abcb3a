"""Agent Q's Monte Carlo tree search, as pure logic with no model or database inside.

One simulation is a generator: it walks the tree, steps the env, and *yields* what it
needs from a model (`Sample` K proposals or a rollout action, `Rank` the env's available
actions, `Critique` the proposals), receiving the answers by `send`. Its phases (select_leaf,
expand, rollout, backpropagate) are functions of their own; those that ask a model are
generators too, joined by `yield from`. A driver decides how to serve those requests: the
batched searcher gathers the requests of many trees into one generate call; a
sequential driver serves them one at a time. The algorithm is the same in both.

Selection is UCB1 as in Agent Q eq. 7, `Q + c*sqrt(log N(parent) / (1 + N(child)))`, or
PUCT with the critic's score as prior, where a visited child's Q is eq. 10's
`alpha*Q_mcts + (1-alpha)*critic score` and an unvisited child's is its critic score (the AI
critique orders first visits), or the best ending one listed step on (`cfg.finish`). A
terminal child's Q is the reward the env gave it, visited or not. Backup keeps a running mean
of returns (Q_mcts): a new leaf's value is the return of a rollout to a terminal state, or
(`cfg.leaf_value`) the critic's score of its action, AlphaZero-style, or their mean.

Verifier-free search (`cfg.verifier` false, what inference runs: eval.mcts) never reads the
env's reward: an action calling one of the env's `ending_tools` is not executed but becomes a
terminal leaf, an ending step the env ran anyway has its reward dropped, and every leaf,
terminal ones included, is worth the critic's score; with `cfg.finish` (a learned critic), the
listed endings are always children, and a child that goes on is worth the critic's value of
the endings its state lists, never run, less the step it costs (docs/architecture.md).

Where the env lists its actions, search also spends env steps, which cost microseconds in a
simulator with snapshots, to save model calls, which cost seconds on a CPU: the endings a
state offers are tried on a snapshot (`finishing_steps`), so a rollout that passes the right
state scores it even if the policy walks on, and the listed children that end well come first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from dataclasses import dataclass, field

from offline_agent.envs.base import Env, StepResult
from offline_agent.rollout import make_step
from offline_agent.search.config import SearchConfig
from offline_agent.search.requests import Critique, Rank, Sample
from offline_agent.seeding import stable_seed
from offline_agent.types import SUCCESS, Step, Task, ToolCall, Trajectory


@dataclass
class Node:
    id: int  # local to the tree: the index in Tree.nodes
    parent: int | None
    depth: int  # agent steps from the root
    action: str = ""  # raw text the policy wrote to get here ("" at the root)
    token_ids: list[int] | None = None  # the ids it generated for it (None: env-listed action)
    tool_call: ToolCall | None = None
    observation: str = ""
    reward: float = 0.0  # env reward of this step (the outcome, on terminal steps)
    terminal: bool = False  # episode over (done, or max depth reached)
    invalid: bool = False
    visits: int = 0
    value_sum: float = 0.0
    realized_sum: float = 0.0  # the same visits' returns of the policy's own playouts (no
    #   listed ending tried on a snapshot): what the learned critic fits
    critic_rank: int | None = None  # 0 = the critic's favourite among its siblings
    critic_score: float | None = None  # in [0, 1]; siblings' scores sum to 1
    ending: float | None = None  # best reward of a listed action that ends the episode here
    info: dict = field(default_factory=dict)  # the env's StepResult.info (e.g. truncated)
    snapshot: dict = field(default_factory=dict)  # Env.snapshot() after this step (JSON data)
    created_sim: int = 0
    children: list[int] = field(default_factory=list)

    @property
    def q(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0


@dataclass
class Tree:
    task: Task
    nodes: list[Node]
    simulations_done: int = 0
    base: int = 0  # where selection starts: the root, or at inference the last committed node

    @classmethod
    def new(cls, task: Task, env: Env) -> Tree:
        observation = env.reset(task)
        root = Node(id=0, parent=None, depth=0, observation=observation, snapshot=env.snapshot())
        return cls(task=task, nodes=[root])

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def path(self, node: Node) -> list[Node]:
        """Nodes from the root down to `node`, both included."""
        out = [node]
        while out[-1].parent is not None:
            out.append(self.nodes[out[-1].parent])
        return out[::-1]

    def steps(self, node: Node) -> list[Step]:
        """The agent steps that lead from the root to `node`."""
        return [
            Step(action=n.action, observation=n.observation, tool_call=n.tool_call,
                 reward=n.reward, done=n.terminal, invalid=n.invalid, info=n.info,
                 token_ids=n.token_ids)
            for n in self.path(node)[1:]
        ]

    def add_child(self, parent: Node, **fields) -> Node:
        node = Node(id=len(self.nodes), parent=parent.id, depth=parent.depth + 1, **fields)
        self.nodes.append(node)
        parent.children.append(node.id)
        return node


@dataclass
class SimulationResult:
    simulation: int  # index of this simulation in its tree
    trajectory: Trajectory  # root -> selected leaf -> rollout, as the env saw it
    reward: float  # the backed-up return
    new_nodes: list[int]  # ids of nodes created by this simulation
    path: list[int]  # ids whose visits/value changed


# ---- what a simulation weighs --------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """A distinct action tried once from the node being expanded: a child if chosen."""

    text: str  # what the policy wrote, or the listed action
    call: ToolCall | None  # what the text parsed into
    result: StepResult  # what the env answered
    snapshot: dict  # Env.snapshot() after the step
    ending: float | None  # best listed ending one step on (with cfg.finish), else None
    token_ids: list[int] | None  # the ids the policy generated for `text` (None: listed)

    @property
    def end_value(self) -> float:
        """How well it ends: its own reward if it ends the episode, else the best ending one
        step on, else -1."""
        if self.result.done:
            return self.result.reward
        return -1.0 if self.ending is None else self.ending


@dataclass(frozen=True)
class Ending:
    """One way a simulation can end: its reward, the steps from the root, the final state."""

    reward: float
    steps: list[Step]
    snapshot: dict  # Env.snapshot() at the end


# ---- pure pieces ---------------------------------------------------------------------------
def ucb1(q: float, n_parent: int, n_child: int, c: float) -> float:
    """Agent Q eq. 7."""
    return q + c * math.sqrt(math.log(max(n_parent, 1)) / (1 + n_child))


def puct(q: float, prior: float, n_parent: int, n_child: int, c: float) -> float:
    """AlphaZero-style: the critic's score steers exploration as a prior."""
    return q + c * prior * math.sqrt(n_parent) / (1 + n_child)


def child_value(node: Node, alpha: float, uniform: float, verifier: bool = True,
                step_cost: float = 0.0) -> float:
    """Agent Q eq. 10, alpha*Q_mcts + (1-alpha)*Q_critic, once visited; before that, the
    critic's score alone (`uniform` without a critic), so the AI critique orders first visits.
    A terminal child is worth the reward the env gave it when it was expanded, visited or not:
    that score is exact, and mixing in the critic's guess made search re-select endings known
    to fail (a simulation that learns nothing). Verifier-free (`verifier` false), a terminal
    child has no reward: it is valued like any other, by `critic_value`."""
    if node.terminal and verifier:
        return node.reward
    critic = critic_value(node, uniform, verifier, step_cost)
    if node.visits:
        return alpha * node.q + (1 - alpha) * critic
    return critic if node.ending is None or not verifier else node.ending


def critic_value(node: Node, uniform: float, verifier: bool, step_cost: float = 0.0) -> float:
    """The critic's score of the node's action (`uniform` without one). Verifier-free with
    `finish`, a child whose state lists endings is worth ending there instead: `ending`, the
    critic's value of the best of them (`critic_endings`), less the step it costs. So going on
    must promise more than ending now by more than a step: an action that leaves the state as
    it was (re-clicking a chosen option) is worth what ending here is, less the step; at step
    cost 0 the tie goes to ending, which leads the children (`expand`)."""
    critic = uniform if node.critic_score is None else node.critic_score
    return critic if verifier or node.ending is None else node.ending - step_cost


def select_child(tree: Tree, node: Node, cfg: SearchConfig) -> Node:
    """The child maximising UCB1 (or PUCT); ties go to the earlier child."""
    children = [tree.nodes[i] for i in node.children]
    uniform = 1.0 / len(children)
    # PUCT's prior is a share among siblings: the frozen critic's scores are one already, a
    # learned critic's are predicted returns
    scored = sum(c.critic_score or 0.0 for c in children)

    def score(child: Node) -> float:
        value = child_value(child, cfg.alpha, uniform, cfg.verifier, cfg.step_cost)
        if cfg.selection == "puct":
            prior = (uniform if child.critic_score is None or scored <= 0
                     else child.critic_score / scored)
            return puct(value, prior, node.visits, child.visits, cfg.c)
        return ucb1(value, node.visits, child.visits, cfg.c)

    return max(children, key=score)


def backup(nodes: list[Node], reward: float, realized: float) -> None:
    """Running mean along the selected path: Q <- (Q*N + R) / (N + 1); the realized return
    keeps its own sum over the same visits."""
    for node in nodes:
        node.visits += 1
        node.value_sum += reward
        node.realized_sum += realized


def action_key(action: str, call: ToolCall | None) -> str:
    """Proposals that parse to the same call (or read the same) are one child."""
    if call is not None:
        return json.dumps([call.name, call.arguments], sort_keys=True)
    return " ".join(action.split())


def finishing_steps(env: Env) -> list[tuple[Step, dict]]:
    """The env's listed actions that end the episode here, each with its step and end state.

    Tried on a snapshot and undone: env steps, no model call. A small policy often reaches
    the right state and then fails to end it (SmolLM2-135M seldom writes `buy` after the
    right MiniShop option click), so the rollout checks the ending the page offers."""
    here, out = env.snapshot(), []
    for text in env.available_actions():
        call, result = env.act(text)
        if result.done and not result.info.get("truncated"):
            out.append((make_step(text, call, result), env.snapshot()))
        env.restore(here)
    return out


def best_ending(env: Env) -> float | None:
    """The best reward of ending the episode with one listed action from here, if any."""
    return max((step.reward for step, _ in finishing_steps(env)), default=None)


def interleave(orders: list[list[str]]) -> list[str]:
    """The first of each order, then the second of each, ..., without repeats."""
    out: list[str] = []
    for row in zip(*orders):
        for a in row:
            if a not in out:
                out.append(a)
    return out


def rank_scores(scores: list[float]) -> list[int]:
    """Rank of each score, 0 for the highest; ties keep proposal order."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranks = [0] * len(scores)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


# ---- one simulation: select, expand, roll out, back up --------------------------------------
def simulate(
    tree: Tree, env: Env, cfg: SearchConfig, use_critic: bool = True
) -> Generator[Sample | Rank | Critique, list, SimulationResult]:
    """Select, expand (K proposals + critique), roll out to a terminal state (unless the
    critic alone values leaves), back up. The phases that need a model pass their requests up
    to the driver through `yield from`."""
    if cfg.leaf_value != "rollout" and not use_critic:
        raise ValueError(f"search.leaf_value {cfg.leaf_value} needs a critic")
    sim = tree.simulations_done
    node = select_leaf(tree, cfg)
    new_nodes: list[int] = []
    if not node.terminal:
        new_nodes = yield from expand(tree, node, env, cfg, sim, use_critic)
        node = select_child(tree, node, cfg)
    if cfg.leaf_value == "critic":
        ending = played = at_leaf(tree, node)
    else:
        ending, played = yield from rollout(tree, node, env, cfg, sim)
    value, realized = leaf_value(node, ending, cfg), leaf_value(node, played, cfg)
    return backpropagate(tree, node, env, ending, (value, realized), cfg, sim, new_nodes)


def select_leaf(tree: Tree, cfg: SearchConfig) -> Node:
    """Selection: descend from the tree's base (the root, unless search at inference has
    committed steps) through expanded, non-terminal nodes."""
    node = tree.nodes[tree.base]
    while node.children and not node.terminal:
        node = select_child(tree, node, cfg)
    return node


def expand(
    tree: Tree, node: Node, env: Env, cfg: SearchConfig, sim: int, use_critic: bool
) -> Generator[Sample | Rank | Critique, list, list[int]]:
    """Expansion: give `node` up to k children, scored by the critic; returns their ids.

    They are the first distinct valid proposals, then (cfg.listed of them) the env's available
    actions no sample proposed, then one invalid proposal if room is left (junk is a useful
    rejected example once, a waste of search after); see `choose_children`."""
    history = tree.steps(node)
    env.restore(node.snapshot)
    available = yield from ranked_available(tree, env, cfg, history)
    temperatures = [cfg.expand_temperature] * (cfg.k * cfg.oversample)
    if cfg.expand_greedy:
        temperatures[0] = 0.0
    seed = stable_seed(cfg.seed, tree.task.id, sim, "expand", node.id)
    proposals = yield Sample(tree.task, tree.root.observation, history, temperatures, seed,
                             env.call_tools())
    last = node.depth + 1 >= cfg.max_depth  # children at max depth end there
    seen: set[str] = set()
    # verifier-free with finish, the listed endings are tried first and lead the listed: a
    # proposal that writes one its own way ("buy[navy]") is the same call, and the env's words
    # stand for it; ending here is then among the children wherever cfg.listed allows one
    first = ending_actions(env, available) if cfg.finish and not cfg.verifier else []
    ends = try_actions(env, node, [(a, None) for a in first], seen, last, cfg)
    sampled = try_actions(env, node, proposals, seen, last, cfg)
    listed = ends + try_actions(env, node, [(a, None) for a in available], seen, last, cfg)
    chosen = choose_children(sampled, listed, cfg)
    # and lead the children: select_child's ties go to the earlier child, and a no-op (a
    # re-click) is worth exactly what ending here is (one state, one remembered value)
    chosen = [c for c in chosen if c in ends] + [c for c in chosen if c not in ends]
    children = add_children(tree, node, chosen, sim, last)
    yield from critique(tree, children, history, use_critic, cfg.leaf_value != "rollout")
    if cfg.finish and not cfg.verifier:
        yield from critic_endings(tree, children, env)
    return [child.id for child in children]


def ranked_available(
    tree: Tree, env: Env, cfg: SearchConfig, history: list[Step]
) -> Generator[Rank, list, list[str]]:
    """The env's listed actions here (none unless cfg.listed), the tops of the task's PMI and
    the policy's log-prob rankings in turn."""
    available = env.available_actions() if cfg.listed else []
    if not available:
        return []
    rankings = yield Rank(tree.task, tree.root.observation, history, available)
    return interleave([[available[i] for i in sorted(range(len(available)),
                                                     key=lambda i: -scores[i])]
                       for scores in rankings])


def try_actions(env: Env, node: Node, texts: list[tuple[str, list[int] | None]],
                seen: set[str], last: bool, cfg: SearchConfig) -> list[Candidate]:
    """Each of `texts` (text, generated ids) stepped from the node's state (`search_step`), but
    those whose `action_key` is in `seen` (which gains the keys of the new ones). With
    cfg.finish, a candidate that does not end the episode (nor reach max depth, `last`) looks
    for the best ending one listed step on."""
    out = []
    for text, ids in texts:
        env.restore(node.snapshot)
        call, result, snapshot = search_step(env, text, cfg.verifier)
        key = action_key(text, call)
        if key in seen:
            continue
        seen.add(key)
        tries = cfg.finish and cfg.verifier and not (result.done or last)
        ending = best_ending(env) if tries else None
        out.append(Candidate(text, call, result, snapshot, ending, ids))
    return out


UNSCORED = "unscored"  # StepResult.info key of an ending step whose reward search never read


def search_step(env: Env, text: str, verifier: bool) -> tuple[ToolCall | None, StepResult, dict]:
    """`env.act(text)` and the snapshot after it. Verifier-free (`verifier` false), a call of
    one of the env's `ending_tools` is not executed (its reward would be computed): it is a
    terminal step that leaves the state as it was; an ending step the env ran anyway (an env
    that declares no `ending_tools`) keeps only its observation, its reward dropped."""
    if not verifier and (call := env.ending_call(text)) is not None:
        return call, StepResult("", done=True, info={UNSCORED: "not run"}), env.snapshot()
    call, result = env.act(text)
    if not verifier and result.done:
        result = StepResult(result.observation, done=True, invalid=result.invalid,
                            info={UNSCORED: "reward dropped"})
    return call, result, env.snapshot()


def choose_children(sampled: list[Candidate], listed: list[Candidate],
                    cfg: SearchConfig) -> list[Candidate]:
    """The first k of: valid proposals and min(cfg.listed, available) listed actions in the
    first k slots, then the other valid and listed ones, then one invalid proposal. With
    cfg.finish (reading the verifier), listed actions that end well (or lead to a good ending)
    come first, and so do the proposals after the first (the greedy one) that the env already
    scored above 0: every proposal was stepped, and a `submit` that passed should not be
    dropped for being drawn fifth. Verifier-free with cfg.finish, `expand` puts the listed
    endings first among the listed (never run; the critic values them): ending here is always a
    choice, so a child that goes on is weighed against it (`critic_value`)."""
    valid = [c for c in sampled if not c.result.invalid]
    if cfg.finish and cfg.verifier:
        listed = sorted(listed, key=lambda c: -c.end_value)
        valid = valid[:1] + sorted(valid[1:], key=lambda c: -max(c.end_value, 0.0))
    invalid = [c for c in sampled if c.result.invalid][:1]
    m = min(cfg.listed, len(listed))
    return (valid[:cfg.k - m] + listed[:m] + valid[cfg.k - m:] + listed[m:] + invalid)[:cfg.k]


def add_children(tree: Tree, node: Node, chosen: list[Candidate], sim: int,
                 last: bool) -> list[Node]:
    """The chosen candidates as children of `node`; at max depth (`last`) they end there."""
    return [
        tree.add_child(node, action=c.text, token_ids=c.token_ids, tool_call=c.call,
                       observation=c.result.observation,
                       reward=c.result.reward, invalid=c.result.invalid, created_sim=sim,
                       ending=c.ending, terminal=c.result.done or last, snapshot=c.snapshot,
                       info=c.result.info)
        for c in chosen
    ]


def critique(tree: Tree, children: list[Node], history: list[Step], use_critic: bool,
             values: bool) -> Generator[Critique, list, None]:
    """Store the critic's score and rank of each new child (uniform without a critic, or with
    one child unless the scores are leaf `values`)."""
    if use_critic and (len(children) > 1 or values):
        scores = yield Critique(tree.task, tree.root.observation, history,
                                [c.action for c in children])
    else:
        scores = [1.0 / len(children)] * len(children)
    for child, score, rank in zip(children, scores, rank_scores(scores)):
        child.critic_score, child.critic_rank = float(score), rank


def ending_actions(env: Env, actions: list[str]) -> list[str]:
    """Those of `actions` that would end the episode in the env's state (`Env.ending_call`;
    none is run)."""
    return [a for a in actions if env.ending_call(a) is not None]


def critic_endings(tree: Tree, children: list[Node], env: Env) -> Generator[Critique, list, None]:
    """`finish` without the verifier: each new non-terminal child whose state lists actions
    that would end the episode (`Env.ending_call`; none are run) gets as `ending` the critic's
    best value of them there, one Critique per such child."""
    for child in children:
        if child.terminal:
            continue
        env.restore(child.snapshot)
        if endings := ending_actions(env, env.available_actions()):
            values = yield Critique(tree.task, tree.root.observation, tree.steps(child), endings)
            child.ending = float(max(values))


def rollout(tree: Tree, node: Node, env: Env, cfg: SearchConfig,
            sim: int) -> Generator[Sample, list, tuple[Ending, Ending]]:
    """Rollout: the policy plays from `node` to a terminal state or max depth. With cfg.finish,
    every state it passes also tries the env's listed actions that end the episode. Returns the
    best ending net of step costs (ties go to the earliest, shortest) and the policy's own
    playout: the one is what search backs up, the other what the policy realises."""
    if node.terminal:
        ending = at_leaf(tree, node)
        return ending, ending
    steps = tree.steps(node)
    env.restore(node.snapshot)
    endings: list[Ending] = []
    for depth in range(node.depth, cfg.max_depth):
        if cfg.finish:
            endings += [Ending(s.reward, [*steps, s], snap) for s, snap in finishing_steps(env)]
            if any(e.reward >= SUCCESS for e in endings):
                break  # nothing later does better
        seed = stable_seed(cfg.seed, tree.task.id, sim, "rollout", depth)
        ((text, ids),) = yield Sample(tree.task, tree.root.observation, steps,
                                      [cfg.rollout_temperature], seed, env.call_tools())
        steps.append(make_step(text, *env.act(text), ids))
        if steps[-1].done:
            break
    played = Ending(steps[-1].reward if steps[-1].done else 0.0, steps, env.snapshot())
    best = max([*endings, played], key=lambda e: e.reward - cfg.step_cost * len(e.steps))
    return best, played


def at_leaf(tree: Tree, node: Node) -> Ending:
    """The simulation ends where it stands: no rollout (a terminal node, or leaves the critic
    values); its reward is the node's if it ended the episode."""
    return Ending(node.reward if node.terminal else 0.0, tree.steps(node), node.snapshot)


def leaf_value(node: Node, ending: Ending, cfg: SearchConfig) -> float:
    """What a simulation backs up (cfg.leaf_value): the ending's reward less step costs
    (rollout), the critic's score of the leaf's action less the costs of the steps to it
    (critic), or their mean (mix). A terminal leaf is worth its reward where the verifier is
    read (exact), and its critic value (`critic_value`) where it is not."""
    ret = ending.reward - cfg.step_cost * len(ending.steps)
    if cfg.leaf_value == "rollout" or (node.terminal and cfg.verifier):
        return ret
    critic = critic_value(node, 0.0, cfg.verifier, cfg.step_cost) - cfg.step_cost * node.depth
    return critic if cfg.leaf_value == "critic" else (ret + critic) / 2


def backpropagate(tree: Tree, node: Node, env: Env, ending: Ending, values: tuple[float, float],
                  cfg: SearchConfig, sim: int, new_nodes: list[int]) -> SimulationResult:
    """Backup: `values` (the ending's, the policy's own playout's) join the running sums of
    every node from the root to `node`, and the tree counts one more simulation.
    Verifier-free, the trajectory claims no achieved task (hindsight reads the terminal
    state)."""
    env.restore(ending.snapshot)
    path = tree.path(node)
    value, realized = values
    backup(path, value, realized)
    tree.simulations_done += 1
    task = tree.task
    achieved = env.describe_achieved() if cfg.verifier else None
    trajectory = Trajectory(task_id=task.id, env=task.env, instruction=task.instruction,
                            first_observation=tree.root.observation, steps=ending.steps,
                            reward=ending.reward, achieved=achieved)
    return SimulationResult(sim, trajectory, value, new_nodes, [n.id for n in path])


def drive(simulation: Generator, serve) -> SimulationResult:
    """Run one simulation, answering each request with `serve(request)` (no batching)."""
    try:
        request = next(simulation)
        while True:
            request = simulation.send(serve(request))
    except StopIteration as stop:
        return stop.value

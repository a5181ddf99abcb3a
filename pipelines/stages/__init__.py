"""The pipeline, in order. Each stage: (name, config sections its results depend on, function).
With run.iterations = N, rounds 2..N (search@k, critic@k, mine@k, train@k, eval@k) follow
round 1's eval; then the mcts stage (search at inference, eval.mcts) and the report. Each Stage carries its round, which
the stage function reads as ctx.round.

Stage modules import heavy libraries (torch, transformers) inside their functions, so that
`offline-agent status` and `--help` stay fast.

A stage module never imports another stage module (tests/test_imports.py): what one stage
leaves for another (round k's model, the fitted critic, trained adapters, stats keys) is found
and loaded through pipelines/artifacts.py. This file alone names them all.
"""

from dataclasses import replace

from pipelines.rounds import round_name
from pipelines.runner import Stage
from pipelines.stages.baseline import run_baseline
from pipelines.stages.critic import run_critic
from pipelines.stages.eval import run_eval
from pipelines.stages.export import run_export
from pipelines.stages.grpo import run_grpo
from pipelines.stages.mcts import run_mcts
from pipelines.stages.mine import run_mine
from pipelines.stages.report import run_report
from pipelines.stages.search import run_search
from pipelines.stages.tasks import run_tasks
from pipelines.stages.train import run_train


def search_shard(cfg) -> str:
    return cfg.search.shard


def _without(hashed: dict, keys: tuple[str, ...]) -> dict:
    return {**hashed, "env": {k: v for k, v in hashed["env"].items() if k not in keys}}


def no_test_tasks(hashed: dict) -> dict:
    """Only eval reads the test tasks: env.test_tasks does not change other stages' results
    (so raising it to evaluate on more tasks keeps a finished search and training)."""
    return _without(hashed, ("test_tasks",))


def train_tasks_only(hashed: dict) -> dict:
    """The stages before train read only the train tasks (train.select reads the validation
    ones): neither the test nor the validation task count changes their results."""
    return _without(hashed, ("test_tasks", "val_tasks"))


def first_search(hashed: dict) -> dict:
    """train_tasks_only, and search.critic learned read as frozen: round 1 has no fitted
    critic yet and searches with the frozen one (pipelines/stages/search.py make_critic)."""
    out = train_tasks_only(hashed)
    if out["search"]["critic"] == "learned":
        out["search"] = {**out["search"], "critic": "frozen"}
    return out


SEARCH_AT_INFERENCE = ("mcts", "mcts_policies", "mcts_simulations", "mcts_commit", "mcts_tasks")


def greedy_eval(hashed: dict) -> dict:
    """eval.mcts* only shape the mcts stage: choosing them never replays a greedy episode."""
    return {**hashed, "eval": {k: v for k, v in hashed["eval"].items()
                               if k not in SEARCH_AT_INFERENCE}}


STAGES: list[Stage] = [
    Stage("tasks", ("run", "env"), run_tasks),
    Stage("baseline", ("run", "env", "model"), run_baseline, shard=search_shard,
          view=train_tasks_only),
    Stage("search", ("run", "env", "model", "search"), run_search, shard=search_shard,
          view=first_search),
    # fits the learned critic (search.critic: learned) that mining's eq. 10 reads
    Stage("critic", ("run", "env", "model", "search", "critic"), run_critic,
          view=train_tasks_only),
    Stage("mine", ("run", "env", "model", "search", "critic", "mine"), run_mine,
          view=train_tasks_only),
    Stage("export", ("run", "env", "model", "search", "critic", "mine"), run_export,
          view=train_tasks_only, outputs=("export",)),
    Stage("train", ("run", "env", "model", "search", "critic", "mine", "train"), run_train,
          view=no_test_tasks),
    Stage("grpo", ("run", "env", "model", "search", "critic", "mine", "train", "grpo"), run_grpo,
          view=no_test_tasks),
    # eval depends on everything that made the adapters it evaluates
    Stage("eval", ("run", "env", "model", "search", "critic", "mine", "train", "grpo", "eval"),
          run_eval, view=greedy_eval),
    # search at inference, after the last round's eval (pipeline() gives it that round)
    Stage("mcts", ("run", "env", "model", "search", "critic", "mine", "train", "grpo", "eval"),
          run_mcts, reruns=True),
    # Reads only what earlier stages stored; `offline-agent report RUN_DIR` re-renders it.
    Stage("report", (), run_report, outputs=("report",), reruns=True),
]

# Round k >= 2 searches with the policy round k-1 trained: its stages depend on every section
# that made it. They are never sharded (a shard run holds them; run them on the merged run).
ROUND = [("search", run_search), ("critic", run_critic), ("mine", run_mine),
         ("train", run_train), ("eval", run_eval)]
ROUND_SECTIONS = ("run", "env", "model", "search", "critic", "mine", "train")


def pipeline(iterations: int) -> list[Stage]:
    """STAGES with rounds 2..iterations inserted before the mcts stage, which belongs to the
    last round (it reads that round's critic and every round's policies)."""
    rounds = [Stage(round_name(name, r), ROUND_SECTIONS + (("eval",) if name == "eval" else ()),
                    fn, round=r, view=greedy_eval if name == "eval" else no_test_tasks)
              for r in range(2, iterations + 1) for name, fn in ROUND]
    mcts, report = STAGES[-2:]
    return STAGES[:-2] + rounds + [replace(mcts, round=iterations), report]


def in_pipeline_order(iterations: int, stored: list[str]) -> list[str]:
    """Every stage of pipeline(iterations) in order, then any other stored stage (one an older
    config had): what `offline-agent status` and the results page list, done or not."""
    planned = [s.name for s in pipeline(iterations)]
    return planned + [n for n in dict.fromkeys(stored) if n not in planned]

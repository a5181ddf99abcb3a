"""The pipeline, in order. Each stage: (name, config sections its results depend on, function).
With run.iterations = N, rounds 2..N (search@k, critic@k, mine@k, train@k, eval@k) follow
round 1's eval; the report comes last (pipelines/rounds.py). Each Stage carries its round, which
the stage function reads as ctx.round.

Stage modules import heavy libraries (torch, transformers) inside their functions, so that
`offline-agent status` and `--help` stay fast.
"""

from pipelines.rounds import round_name
from pipelines.runner import Stage, whole
from pipelines.stages.baseline import run_baseline
from pipelines.stages.critic import run_critic
from pipelines.stages.eval import run_eval
from pipelines.stages.export import run_export
from pipelines.stages.grpo import run_grpo
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
          run_eval),
    # Reads only what earlier stages stored; `offline-agent report RUN_DIR` re-renders it.
    Stage("report", (), run_report, outputs=("report",)),
]

# Round k >= 2 searches with the policy round k-1 trained: its stages depend on every section
# that made it. They are never sharded (a shard run holds them; run them on the merged run).
ROUND = [("search", run_search), ("critic", run_critic), ("mine", run_mine),
         ("train", run_train), ("eval", run_eval)]
ROUND_SECTIONS = ("run", "env", "model", "search", "critic", "mine", "train")


def pipeline(iterations: int) -> list[Stage]:
    """STAGES with rounds 2..iterations inserted before the report."""
    rounds = [Stage(round_name(name, r), ROUND_SECTIONS + (("eval",) if name == "eval" else ()),
                    fn, round=r, view=whole if name == "eval" else no_test_tasks)
              for r in range(2, iterations + 1) for name, fn in ROUND]
    return STAGES[:-1] + rounds + STAGES[-1:]

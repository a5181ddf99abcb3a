"""The pipeline, in order. Each stage: (name, config sections its results depend on, function).

Stage modules import heavy libraries (torch, transformers) inside their functions, so that
`offline-agent status` and `--help` stay fast.
"""

from pipelines.runner import Stage
from pipelines.stages.baseline import run_baseline
from pipelines.stages.eval import run_eval
from pipelines.stages.export import run_export
from pipelines.stages.mine import run_mine
from pipelines.stages.report import run_report
from pipelines.stages.search import run_search
from pipelines.stages.tasks import run_tasks
from pipelines.stages.train import run_train


def search_shard(cfg) -> str:
    return cfg.search.shard


STAGES: list[Stage] = [
    Stage("tasks", ("run", "env"), run_tasks),
    Stage("baseline", ("run", "env", "model"), run_baseline, shard=search_shard),
    Stage("search", ("run", "env", "model", "search"), run_search, shard=search_shard),
    Stage("mine", ("run", "env", "model", "search", "mine"), run_mine),
    Stage("export", ("run", "env", "model", "search", "mine"), run_export),
    Stage("train", ("run", "env", "model", "search", "mine", "train"), run_train),
    # eval depends on everything that made the adapters it evaluates
    Stage("eval", ("run", "env", "model", "search", "mine", "train", "eval"), run_eval),
    # Reads only what earlier stages stored; `offline-agent report RUN_DIR` re-renders it.
    Stage("report", (), run_report),
]

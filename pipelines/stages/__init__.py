"""The pipeline, in order. Each stage: (name, config sections its results depend on, function).

Stage modules import heavy libraries (torch, transformers) inside their functions, so that
`offline-agent status` and `--help` stay fast.
"""

from pipelines.runner import Stage
from pipelines.stages.baseline import run_baseline
from pipelines.stages.search import run_search
from pipelines.stages.tasks import run_tasks
from pipelines.stages.train import run_train


def search_shard(cfg) -> str:
    return cfg.search.shard


STAGES: list[Stage] = [
    Stage("tasks", ("run", "env"), run_tasks),
    Stage("baseline", ("run", "env", "model"), run_baseline, shard=search_shard),
    Stage("search", ("run", "env", "model", "search"), run_search, shard=search_shard),
    # TODO(lead): the mine stage goes before train, and "mine" into train's sections.
    Stage("train", ("run", "env", "model", "search", "train"), run_train),
    # then grpo, eval, report (their issues).
]

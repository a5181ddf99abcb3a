"""Test launcher: `python -m tests.kill_after_commit N ARGS...` runs `offline-agent ARGS` and
SIGKILLs the process right after the search stage's N-th commit: a real hard kill at a known
point, installed as the search stage's after_commit hook (production code reads no test
variable)."""

from __future__ import annotations

import os
import signal
import sys

from pipelines import cli
from pipelines.stages import search


def main(argv: list[str]) -> int:
    n = int(argv[0])

    def kill(commits: int) -> None:
        if commits == n:
            os.kill(os.getpid(), signal.SIGKILL)

    search.after_commit = kill
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

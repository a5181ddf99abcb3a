"""Sandbox start-up cost: this branch's full isolation vs a named baseline's
offline_agent/sandbox/process.py (by default `main`'s), run side by side, alternating, in one
process, both under the isolation probed here. The baseline must hold that file (revisions
before the sandbox became a package kept it as offline_agent/envs/sandbox.py, whose imports
no longer resolve).

The Python env runs one sandboxed program per `run_tests`/`submit` action, so the cost of a
tiny program (interpreter start-up plus isolation set-up) bounds how fast that env searches.
Prints the median and 90th percentile per variant and the ratio of medians.

    .venv/bin/python benchmarks/sandbox.py [--runs 40] [--baseline main]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from offline_agent import sandbox
from offline_agent.sandbox import process

PROGRAMS = {
    "print": "print(6 * 7)",
    "harness-like": "import json, signal, io, contextlib\nprint(json.dumps([1, 2, 3]))",
}


def load_baseline(rev: str) -> types.ModuleType:
    """process.py as committed at `rev`, as its own module."""
    src = subprocess.run(
        ["git", "show", f"{rev}:offline_agent/sandbox/process.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    module = types.ModuleType(f"sandbox_at_{rev}")
    module.__file__ = str(Path(process.__file__))  # the launcher file sits beside it
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(src, f"{rev}:process.py", "exec"), module.__dict__)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="runs per variant and program")
    ap.add_argument("--baseline", default="main", help="git revision of the baseline")
    args = ap.parse_args()
    base = load_baseline(args.baseline)
    iso = sandbox.require_isolation()
    variants = {f"{args.baseline} process.py": lambda code: base.spawn(code, 5, 512, iso),
                "this branch": lambda code: process.spawn(code, 5, 512, iso)}
    for v in variants.values():  # warm up each once
        v("pass")
    print("layers here:", ", ".join(f"{k}: {v}" for k, v in sandbox.sandbox_report().items()))
    for name, code in PROGRAMS.items():
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.runs):
            for label, fn in variants.items():  # alternate, so load drifts hit both alike
                start = time.perf_counter()
                result = fn(code)
                times[label].append(time.perf_counter() - start)
                assert result.returncode == 0, (label, result)
        med = {k: statistics.median(v) for k, v in times.items()}
        for label, ts in times.items():
            p90 = statistics.quantiles(ts, n=10)[-1]
            print(
                f"{name:13s} {label:22s} median {med[label] * 1e3:6.1f} ms  p90 {p90 * 1e3:6.1f} ms"
            )
        old, new = med.values()
        print(f"{name:13s} ratio this branch / baseline: {new / old:.2f}x (n={args.runs})")


if __name__ == "__main__":
    main()

"""The train stage on 2 processes (the documented `accelerate launch ... --only train`, on CPU
with gloo) against 1: the same losses step by step, the same adapters, and only the main
process opened the store or wrote a file of the run; each process leaves its process group
before exiting."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipelines.cli import main
from pipelines.config import RunConfig
from pipelines.stages import STAGES
from storage import ExampleRow, MetricRow, PairRow, Store
from tests.test_training import step_pair

REPO = Path(__file__).parent.parent
POLICIES = ("dpo_step", "rft")

# The CLI with every store open and atomic file write (os.replace: checkpoints, adapters,
# reference log-probs, config, progress) logged per process, to check who wrote what.
AUDITED_CLI = """
import json, os, sys
import storage

log = open(os.path.join(os.environ["AUDIT_DIR"], f"rank-{os.environ.get('RANK', '0')}.jsonl"), "a")
def note(kind, path):
    log.write(json.dumps([kind, os.path.abspath(str(path))]) + "\\n"); log.flush()
store_init, replace = storage.Store.__init__, os.replace
def opened(self, path, *a, **k):
    note("store", path); store_init(self, path, *a, **k)
def replaced(src, dst, *a, **k):
    note("write", dst); return replace(src, dst, *a, **k)
storage.Store.__init__, os.replace = opened, replaced
from pipelines.cli import main
code = main(sys.argv[1:])
import torch.distributed as dist  # still open at exit, gloo can abort a run that succeeded
with open(os.path.join(os.environ["AUDIT_DIR"], f"group-{os.environ.get('RANK', '0')}"), "w") as f:
    f.write("open" if dist.is_initialized() else "closed")
sys.exit(code)
"""


def settings(model_dir: str) -> RunConfig:
    # 9 pairs (rft: 9 examples), batch 4, one epoch: steps of 4, 4 and 1 items (on 2
    # processes the last leaves one process without an item)
    return RunConfig.from_dict({
        "model": {"id": model_dir, "device": "cpu"},
        "train": {"policies": list(POLICIES), "batch_size": 4, "epochs": 1, "lr": 3e-3,
                  "warmup_steps": 0, "save_every": 2, "seed": 3}})


def make_run(run_dir: Path, cfg: RunConfig) -> None:
    """A run directory whose store holds mined pairs and examples, every stage before train
    marked done under `cfg` (so `--only train` runs)."""
    run_dir.mkdir(parents=True)
    pairs = [PairRow(**step_pair(i), task_id=f"t{i}", env="minishop", kind="step",
                     chosen_q=0.8, rejected_q=0.1, margin=0.7) for i in range(9)]
    examples = [ExampleRow(example_id=i, task_id=f"t{i}", env="minishop", kind="rft",
                           instruction="i need a blue power bank", reward=1.0,
                           messages=step_pair(i)["prompt"] + step_pair(i)["chosen"])
                for i in range(9)]
    with Store(run_dir / "store.duckdb") as store:
        store.insert_pairs(pairs, "mine")
        store.insert_examples(examples, "mine")
        for stage in STAGES[:[s.name for s in STAGES].index("train")]:
            store.start_stage(stage.name, "", stage.hash(cfg),
                              stage.hashed(cfg))
            store.mark_stage_done(stage.name, "", {})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path: Path, name: str, cfg: RunConfig, processes: int) -> subprocess.Popen:
    """`offline-agent run CONFIG --only train` on `processes` processes, in the background
    (its own process group; output in NAME.log)."""
    run_dir, audit = tmp_path / name, tmp_path / f"{name}-audit"
    make_run(run_dir, cfg)
    audit.mkdir()
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    (tmp_path / "audited_cli.py").write_text(AUDITED_CLI)
    launch = [] if processes == 1 else [
        "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port())]
    env = {**os.environ, "AUDIT_DIR": str(audit), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    with open(tmp_path / f"{name}.log", "w") as log:
        return subprocess.Popen([sys.executable, *launch, str(tmp_path / "audited_cli.py"),
                                 "run", str(tmp_path / "config.yaml"), "--run-dir", str(run_dir),
                                 "--only", "train"], env=env, cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, log: Path) -> None:
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, log.read_text()[-8000:]


def compare_metrics(one: list[MetricRow], two: list[MetricRow], policy: str) -> None:
    """Step by step, the 2-process run's metrics are the 1-process run's, within float error."""
    assert [r.step for r in two] == [1, 2, 3]  # one row per step: no process wrote twice
    assert one[0].data["loss"] != one[-1].data["loss"]  # it learns: equality matters
    for a, b in zip(one, two):
        assert b.data["tokens"] == a.data["tokens"]
        # at step 1 the policy is the reference: each pair's margin is float noise, so the
        # share of positive ones (accuracy) is arbitrary there
        keys = ("loss",) if policy == "rft" else ("loss", "margin") + (
            ("accuracy",) if a.step > 1 else ())
        for key in keys:
            print(f"{policy} step {a.step} {key}: 1 process {a.data[key]:.9g}, "
                  f"2 processes {b.data[key]:.9g}")
            assert b.data[key] == pytest.approx(a.data[key], rel=1e-5, abs=1e-6), key


def adapter_difference(tmp_path: Path, policy: str) -> float:
    """Largest |weight difference| of the two runs' final adapters (which did train)."""
    weights = [load_file(tmp_path / f"p{n}" / "checkpoints" / "train" / policy / "final" /
                         "adapter_model.safetensors") for n in (1, 2)]
    assert weights[0].keys() == weights[1].keys()
    moved = max(w.abs().max().item() for k, w in weights[0].items() if "lora_B" in k)
    assert moved > 1e-3  # B starts at 0: the adapters trained
    diff = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    print(f"{policy}: largest adapter weight difference {diff:.2e} (largest B {moved:.2e})")
    return diff


def check_only_main_wrote(run_dir: Path, audit: Path) -> None:
    def events(rank: int) -> list[list[str]]:
        path = audit / f"rank-{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    main_events, other = events(0), events(1)
    assert ["store", str(run_dir / "store.duckdb")] in main_events
    wrote = {Path(p).relative_to(run_dir).as_posix() for kind, p in main_events
             if kind == "write" and Path(p).is_relative_to(run_dir)}
    assert {"checkpoints/train/dpo_step/reference.pt", "checkpoints/train/dpo_step/step-2",
            "checkpoints/train/dpo_step/final", "checkpoints/train/rft/final"} <= wrote
    assert not [e for e in other if e[0] == "store" or Path(e[1]).is_relative_to(run_dir)]


def test_two_processes_train_as_one_and_only_the_main_one_writes(tiny_model_dir, tmp_path):
    cfg = settings(tiny_model_dir)
    began = time.perf_counter()
    procs = {n: start(tmp_path, f"p{n}", cfg, n) for n in (1, 2)}  # side by side
    for n, proc in procs.items():
        finish(proc, tmp_path / f"p{n}.log")
    print(f"both runs: {time.perf_counter() - began:.1f} s")
    runs = {}
    for n in (1, 2):
        with Store(tmp_path / f"p{n}" / "store.duckdb", read_only=True) as store:
            runs[n] = {p: store.metrics("train", p) for p in POLICIES}
            finals = {p: store.checkpoint("train", "", f"{p}/final") for p in POLICIES}
        assert {p: f["step"] for p, f in finals.items()} == {"dpo_step": 3, "rft": 3}
    for policy in POLICIES:
        compare_metrics(runs[1][policy], runs[2][policy], policy)
        assert adapter_difference(tmp_path, policy) < 1e-5
    reference = [torch.load(tmp_path / f"p{n}" / "checkpoints" / "train" / "dpo_step" /
                            "reference.pt") for n in (1, 2)]
    assert reference[0]["keys"] == reference[1]["keys"]
    # each process ran a share of the very same packed forwards: the same numbers, not close
    assert torch.equal(reference[1]["logps"], reference[0]["logps"])
    check_only_main_wrote(tmp_path / "p2", tmp_path / "p2-audit")
    # each process left its process group before exiting (distributed.leave)
    assert [(tmp_path / "p2-audit" / f"group-{r}").read_text() for r in (0, 1)] == ["closed"] * 2


def test_several_processes_run_only_a_train_stage(tmp_path, monkeypatch, capsys):
    """Launched on several processes, any other stage is refused (the others would wait
    for the main process for as long as search runs): one clear line, every process."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    config = tmp_path / "c.yaml"
    config.write_text(RunConfig().to_yaml())
    assert main(["run", str(config), "--run-dir", str(tmp_path / "r"), "--until", "train"]) == 2
    assert "only a train stage runs on several; add --only train" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()

"""`offline-agent export`: a dataset folder (--out) and the Hub path (--hub) against a stubbed
HfApi and, for real, against no network: one clear line, exit code 2, the folder kept."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.export import push

TOKEN = "hf_secretTOKEN1234567890"


class StubApi:
    """Records calls; fails on upload when told to (nothing is half-written: one call)."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw["repo_id"], kw))
        if self.fail:
            raise RuntimeError(f"401 Unauthorized for token {TOKEN}")

        class Info:
            commit_url = f"https://huggingface.co/datasets/{kw['repo_id']}/commit/abc"
        return Info()


def test_push_is_one_commit_and_never_logs_the_token(mined_run, monkeypatch, capsys, caplog):
    run_dir = mined_run[0]
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    api = StubApi()
    url = push(run_dir / "export", "me/agent-pairs", private=True, revision="v1", api=api)
    assert url.endswith("/commit/abc")
    kinds = [c[0] for c in api.calls]
    assert kinds == ["create_repo", "create_branch", "upload_folder"]
    upload = api.calls[-1][2]
    assert upload["repo_type"] == "dataset" and upload["revision"] == "v1"
    # the same commit drops the repo's data files this export lacks (a now-empty config's)
    assert upload["delete_patterns"] == ["data/*"]
    assert Path(upload["folder_path"]) == run_dir / "export"
    assert api.calls[0][2]["private"] is True
    failing = StubApi(fail=True)
    with pytest.raises(Exception) as err:
        push(run_dir / "export", "me/agent-pairs", False, None, api=failing)
    assert TOKEN not in str(err.value) and "***" in str(err.value)
    assert str(run_dir / "export") in str(err.value)
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err + caplog.text


def test_real_hub_attempt_offline_fails_with_one_clear_line(mined_run, monkeypatch, capsys):
    run_dir = mined_run[0]
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # a real attempt: no route to the Hub here
    assert main(["export", str(run_dir), "--hub", "me/agent-pairs"]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert line.startswith("offline-agent: error: push to the Hub failed") and TOKEN not in line
    assert (run_dir / "export" / "README.md").exists()  # the local folder stays


def test_export_out_writes_a_folder_and_refuses_a_non_empty_one(mined_run, tmp_path, capsys):
    run_dir = mined_run[0]
    out = tmp_path / "ds"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert "rows: pairs 8" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        "hindsight", "pairs", "rft", "trajectory_pairs"]
    assert (out / "data" / "pairs" / "train-00000-of-00001.parquet").exists()
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_export_before_mining_is_a_clear_error(tmp_path, capsys):
    from pipelines.runner import run
    from pipelines.stages import STAGES
    from tests.fakes import fake_cfg

    run(fake_cfg(), tmp_path / "r", STAGES, until="tasks")
    assert main(["export", str(tmp_path / "r"), "--out", str(tmp_path / "o")]) == 2
    assert "no finished `mine` stage" in capsys.readouterr().err


def test_a_config_without_rows_is_left_out_so_every_listed_config_loads(tmp_path):
    """`datasets` cannot load an empty split (a 0-row parquet raises ArrowInvalid, one with no
    row groups "corresponds to no data"): the card lists only configs with rows, each of which
    loads, and asking for the empty one names the configs there are."""
    from datasets import load_dataset

    from pipelines.export import CONFIGS, config_tables, dataset_card, write_dataset
    from tests.fakes import fake_cfg

    messages = [{"role": "user", "content": "go", "tool_calls": None}]
    rows = {c: [] for c in CONFIGS}
    rows["rft"] = [{"messages": messages, "tools": "[]", "run_id": "r", "task_id": "t",
                    "env": "fake", "kind": "rft", "instruction": "go", "source_traj": 1,
                    "reward": 1.0}]
    counts = {c: len(r) for c, r in rows.items()}
    tables = config_tables(rows)
    card = dataset_card(counts, tables, fake_cfg().to_dict(), "r", "m", "mine")
    write_dataset(tmp_path / "ds", tables, card)
    assert sorted(p.name for p in (tmp_path / "ds" / "data").iterdir()) == ["rft"]
    assert "| `pairs` | 0 (left out: an empty split cannot be loaded) |" in card
    cache = str(tmp_path / "hf")
    assert len(load_dataset(str(tmp_path / "ds"), "rft", split="train", cache_dir=cache)) == 1
    with pytest.raises(ValueError, match="rft"):  # datasets names the configs it has
        load_dataset(str(tmp_path / "ds"), "pairs", split="train", cache_dir=cache)


def test_the_rft_count_says_it_holds_the_hindsight_rows(mined_run):
    """mine's rft_examples counts solved episodes; export's rft config adds the hindsight
    relabels (mine.rft_hindsight): the printed line says so, so the two numbers agree."""
    from pipelines.headlines import export_rows, headline

    stats = mined_run[2]["mine"]["stats"]
    counts = {c: mined_run[2]["export"]["stats"][c]
              for c in ("pairs", "trajectory_pairs", "rft", "hindsight")}
    assert counts["rft"] == stats["rft_examples"] + stats["hindsight_examples"]
    said = (f"rft {counts['rft']} ({stats['rft_examples']} solved + "
            f"{stats['hindsight_examples']} hindsight)")
    assert said in export_rows(counts, rft_hindsight=True)
    assert said in headline("export", mined_run[2]["export"]["stats"])  # what status shows
    assert "solved" not in export_rows(counts, rft_hindsight=False)


def test_a_new_export_into_a_folder_of_the_same_name_loads_its_own_rows(tmp_path):
    """`datasets` finds a local folder's cache by the folder's name and card: two runs'
    RUN_DIR/export with the same configs would load the first one's rows for both (even
    download_mode=force_redownload then fails on the cached sizes). The card's dataset_info
    (rows and bytes per config) tells them apart."""
    from datasets import load_dataset

    from pipelines.export import config_tables, dataset_card, write_dataset
    from tests.fakes import fake_cfg

    cache = str(tmp_path / "hf")
    for i, n in enumerate((3, 2)):  # two runs, each exported to .../export
        rows = {c: [] for c in ("pairs", "trajectory_pairs", "rft", "hindsight")}
        rows["rft"] = [{"messages": [{"role": "user", "content": f"go {j}", "tool_calls": None}],
                        "tools": "[]", "run_id": f"r{i}", "task_id": f"t{j}", "env": "fake",
                        "kind": "rft", "instruction": "go", "source_traj": j, "reward": 1.0}
                       for j in range(n)]
        tables = config_tables(rows)
        counts = {c: len(r) for c, r in rows.items()}
        out = tmp_path / f"r{i}" / "export"
        write_dataset(out, tables, dataset_card(counts, tables, fake_cfg().to_dict(), f"r{i}",
                                                "m", "mine"))
        data = load_dataset(str(out), "rft", split="train", cache_dir=cache)
        assert len(data) == n and data[0]["run_id"] == f"r{i}"

"""Optional dependencies: a run or command that needs a missing extra stops at once with the
pip line that installs it, before any stage runs."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from offline_agent.optional_deps import EXTRAS, MissingExtra, missing, require
from pipelines.cli import main
from pipelines.config import RunConfig
from pipelines.errors import RunError
from pipelines.runner import run
from pipelines.stages import pipeline


def hide(monkeypatch, *modules: str) -> None:
    """Make `modules` look uninstalled: find_spec (what `missing` asks) finds nothing, and
    importing them fails."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in modules else real(name, *a))
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_every_extra_is_declared_in_pyproject():
    from pathlib import Path

    import tomllib

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = declared["project"]["optional-dependencies"]
    for module, (extra, _) in EXTRAS.items():
        assert any(dep.startswith(module) for dep in extras[extra]), (module, extra)


def test_missing_names_the_extra(monkeypatch):
    assert missing("matplotlib") is None
    hide(monkeypatch, "matplotlib")
    assert missing("matplotlib") == ("the report stage's charts needs matplotlib, which is not "
                                     "installed: pip install 'offline-agent[report]'")
    with pytest.raises(MissingExtra, match=r"offline-agent\[report\]"):
        require("matplotlib")


def test_run_refuses_before_any_stage(monkeypatch, tmp_path):
    hide(monkeypatch, "matplotlib", "bitsandbytes")
    cfg = RunConfig()
    with pytest.raises(RunError, match=r"offline-agent\[report\]"):
        run(cfg, tmp_path / "r", pipeline(1))
    assert not (tmp_path / "r").exists()  # nothing made, nothing stored
    cfg.train.quantization = "4bit"
    with pytest.raises(RunError, match=r"offline-agent\[qlora\]"):
        run(cfg, tmp_path / "r", pipeline(1), until="train")
    cfg.train.quantization = "none"
    run(cfg, tmp_path / "r", pipeline(1), until="tasks")  # a run without them goes on


def test_tree_command_names_its_extra(monkeypatch, tmp_path, capsys):
    hide(monkeypatch, "networkx")
    assert main(["tree", str(tmp_path), "--task", "t"]) == 2
    assert "pip install 'offline-agent[tree]'" in capsys.readouterr().err

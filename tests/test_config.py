"""RunConfig: precedence, strict keys and types, stable section hashes."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from pipelines.config import ConfigError, RunConfig, diff, help_lines, unhashed_keys

# the keys pipelines/config.py's UNHASHED constant listed before they became field metadata
OLD_UNHASHED = {"run.name", "run.iterations", "search.shard", "model.prefix_cache_gb",
                "eval.bootstrap", "eval.seed", "eval.configs_tried"}
UNHASHED = OLD_UNHASHED | {"run.report_to"}  # and since: where figures go (trackers)


def write(tmp_path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_then_yaml_then_set(tmp_path):
    path = write(tmp_path, "search:\n  k: 6\n  simulations: 3\nenv:\n  kwargs: {max_steps: 4}\n")
    cfg = RunConfig.load(path, ["search.k=9", "env.kwargs.difficulty=hard", "model.adapter=null"])
    assert cfg.search.k == 9  # --set beats YAML
    assert cfg.search.simulations == 3  # YAML beats the default
    assert cfg.search.c == RunConfig().search.c  # default stays
    assert cfg.env.kwargs == {"max_steps": 4, "difficulty": "hard"}
    assert cfg.model.adapter is None
    assert RunConfig.load(None).to_dict() == RunConfig().to_dict()


def test_values_are_yaml_scalars(tmp_path):
    cfg = RunConfig.load(None, ["search.c=1e-3", "search.alpha=1", "search.shard=1/4",
                                "model.adapter=adapters/x", "env.kwargs.flags=[a, b]"])
    assert cfg.search.c == 0.001 and isinstance(cfg.search.alpha, float)
    assert cfg.search.shard == "1/4" and cfg.model.adapter == "adapters/x"
    assert cfg.env.kwargs["flags"] == ["a", "b"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["search.simulatons=3"], "unknown config key 'search.simulatons' (did you mean 'simulations'?)"),
        (["serch.k=3"], "unknown config key 'serch' (did you mean 'search'?)"),
        (["search.k=many"], "config key 'search.k' must be int, got 'many'"),
        (["search.k=2.5"], "config key 'search.k' must be int"),
        (["run.seed=true"], "config key 'run.seed' must be int"),
        (["model.adapter=3"], "config key 'model.adapter' must be str or null"),
        (["env.kwargs=3"], "config key 'env.kwargs' must be a mapping"),
        (["search=3"], "keys look like section.field"),
        (["search.k"], "expects key=value"),
        (["model.backend=onnx"], "model.backend must be one of hf, vllm"),
        (["search.shard=2/2"], "search.shard must look like i/n"),
        (["env.name=nope"], "env.name must be one of"),
    ],
)
def test_mistakes_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        RunConfig.load(None, overrides)
    assert message in str(e.value)


def test_yaml_mistakes(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'model.devise'"):
        RunConfig.load(write(tmp_path, "model:\n  devise: cpu\n"))
    with pytest.raises(ConfigError, match="config key 'search' must be a mapping"):
        RunConfig.load(write(tmp_path, "search: 3\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        RunConfig.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RunConfig.load(write(tmp_path, "search: [\n"))


def test_hash_is_stable_and_per_section():
    cfg = RunConfig.load(None, ["search.k=5"])
    same = RunConfig.from_dict({"search": {"k": 5}, "env": {}})
    assert cfg.hash(["env", "search"]) == same.hash(["search", "env"])
    assert len(cfg.hash(["search"])) == 16
    other = RunConfig.load(None, ["search.k=6"])
    assert other.hash(["env"]) == cfg.hash(["env"]) and other.hash(["search"]) != cfg.hash(["search"])
    # where and how work runs is not what it computes
    moved = RunConfig.load(None, ["search.k=5", "search.shard=1/2", "run.name=elsewhere"])
    assert moved.hash(["run", "search"]) == cfg.hash(["run", "search"])
    assert diff(cfg.hashed(["search"]), other.hashed(["search"])) == ["search.k: 5 -> 6"]


def test_unhashed_keys_are_the_fields_marked_hashed_false():
    assert unhashed_keys() == UNHASHED


def test_the_hash_ignores_exactly_the_unhashed_fields():
    """Every field of every section, changed alone, changes the hash unless it is unhashed."""
    sections = [s.name for s in fields(RunConfig)]
    base = RunConfig().hash(sections)
    seen = set()
    for section in sections:
        for f in fields(getattr(RunConfig(), section)):
            cfg = RunConfig()
            setattr(getattr(cfg, section), f.name, "<changed>")  # hash() reads values only
            key = f"{section}.{f.name}"
            seen.add(key)
            assert (cfg.hash(sections) == base) == (key in UNHASHED), key
            assert (cfg.hash([section]) == RunConfig().hash([section])) == (key in UNHASHED)
    assert UNHASHED < seen and len(seen) > 40  # the walk reached every section's fields


def test_yaml_round_trip_and_help():
    cfg = RunConfig.load(None, ["env.kwargs.max_steps=3", "search.k=2"])
    import yaml

    assert RunConfig.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg
    lines = help_lines()
    assert any(line.strip().startswith("search.k = 4") for line in lines)
    assert all(len(line.split("  ", 2)) == 3 and line.split("  ", 2)[2] for line in lines)


def test_shipped_configs_load():
    configs = Path(__file__).parents[1] / "configs"
    cfg = RunConfig.load(configs / "default.yaml")
    assert cfg.model.device == "cpu" and cfg.env.name == "minishop"
    python = RunConfig.load(configs / "python.yaml")
    assert python.env.name == "python" and python.search.expand_temperature == 0.7
    assert all(RunConfig.load(path).run.name == path.stem for path in configs.glob("*.yaml"))


def test_help_strings_are_one_or_two_lines():
    """A key's help says what it does; explanations and figures live in docs/."""
    for line in help_lines():
        text = line.split("  ", 2)[2]
        assert len(text) <= 160, f"help too long ({len(text)} chars): {line.strip()}"


def test_search_k_above_the_critic_limit_is_refused_at_load(tmp_path, capsys):
    """The frozen critic names each action with one letter; a larger k is a config error
    (naming the key and the limit) before any run directory or model exists."""
    from offline_agent.search.requests import LABELS, MAX_ACTIONS
    from pipelines.cli import main

    assert MAX_ACTIONS == len(LABELS) == 16
    assert RunConfig.load(None, [f"search.k={MAX_ACTIONS}"]).search.k == MAX_ACTIONS
    with pytest.raises(ConfigError, match=r"search\.k is 17, but the frozen critic \(also "
                                          r"round 1's with search\.critic=learned\) ranks at "
                                          r"most 16 actions"):
        RunConfig.load(None, ["search.k=17"])
    # without the critic nothing ranks the children, so nothing limits k
    assert RunConfig.load(None, ["search.k=17", "search.critic=none"]).search.k == 17
    run_dir = tmp_path / "run"
    config = Path(__file__).parents[1] / "configs" / "default.yaml"
    assert main(["run", str(config), "--run-dir", str(run_dir), "--set", "search.k=40"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "search.k is 40" in err and "at most 16" in err
    assert not run_dir.exists()


def test_grpo_under_a_grammar_runs_on_hf_and_is_refused_on_vllm():
    on = ["grpo.enabled=true", "model.constrain=tools"]
    assert RunConfig.load(None, on).model.constrain == "tools"  # hf replays its masks
    with pytest.raises(ConfigError, match="model.constrain=tools needs model.backend=hf"):
        RunConfig.load(None, [*on, "model.backend=vllm"])

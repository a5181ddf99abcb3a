"""RunConfig: one dataclass per section, loaded from YAML, then `--set a.b=c` overrides.

Precedence: dataclass defaults < YAML < --set. Unknown keys and wrong types are errors that
name the key, because a typo silently falling back to a default wastes a whole run.
Stages depend on sections; `hash(sections)` is what the runner compares to decide whether
stored results still match the config.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
import types
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from offline_agent.config_fields import HASHED, HELP, config_field, is_hashed
from offline_agent.envs.base import BUILTIN_ENVS, Env
from offline_agent.envs.trl import build_env
from offline_agent.evaluation import EvalConfig
from offline_agent.mining.config import MineConfig
from offline_agent.policy.models import DEFAULT_MODEL
from offline_agent.search.config import SearchConfig
from offline_agent.training.config import TrainConfig
from offline_agent.training.grpo.config import GRPOConfig
from offline_agent.value.config import CriticConfig
from pipelines.tracking import BACKENDS


class ConfigError(ValueError):
    """A user mistake in a config file or --set override."""


def _choice(section: str, name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{name} must be one of {', '.join(allowed)}, got {value!r}")


@dataclass
class RunSection:
    name: str = config_field("offline-agent", "label; the default run directory is "
                                              "runs/<name>-<timestamp>", hashed=False)
    seed: int = config_field(0, "seed of task generation (the env's seed)")
    # how many rounds to run: a round's results do not depend on it
    iterations: int = config_field(1, "rounds of search -> mine -> train; round k+1 "
                                      "searches with the policy trained in round k", hashed=False)
    report_to: list[str] = field(default_factory=list, metadata={
        HELP: "experiment trackers every stage logs to: any of tensorboard, trackio, wandb "
              "(docs/tracking.md); []: none", HASHED: False})

    def __post_init__(self):
        if self.iterations < 1:
            raise ConfigError("run.iterations must be >= 1")
        for name in self.report_to:
            _choice("run", "report_to", name, tuple(BACKENDS))
        if len(set(self.report_to)) != len(self.report_to):
            raise ConfigError(f"run.report_to lists a tracker twice: {self.report_to}")


@dataclass
class ModelConfig:
    id: str = config_field(DEFAULT_MODEL, "embedded:<name>, a local model folder or a Hugging "
                                          "Face repo id")
    backend: str = config_field("hf", "hf (transformers, CPU or GPU) or vllm (GPU only)")
    device: str = config_field("auto", "auto (cuda when available), cpu or cuda")
    dtype: str = config_field("auto", "auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, "
                                      "float16 (bfloat16 on CPU changes some actions; faster "
                                      "only with avx512_bf16 or AMX)")
    max_batch: int = config_field(32, "most sequences in one generate or forward call")
    adapter: str | None = config_field(None, "LoRA adapter folder applied on top of the model; "
                                             "null: none")
    prefix_cache_gb: float = config_field(2.0, "memory kept for the KV of prompt "
                                               "prefixes already computed (hf "
                                               "backend; vLLM keeps its own); 0: off", hashed=False)
    constrain: str = config_field("none", "none: free text; tools: each reply is decoded under "
                                          "the grammar of one valid tool call (needs xgrammar; "
                                          "docs/environments.md)")

    def __post_init__(self):
        _choice("model", "backend", self.backend, ("hf", "vllm"))
        _choice("model", "device", self.device, ("auto", "cpu", "cuda"))
        _choice("model", "dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        _choice("model", "constrain", self.constrain, ("none", "tools"))
        if self.max_batch < 1:
            raise ConfigError("model.max_batch must be >= 1")
        if self.prefix_cache_gb < 0:
            raise ConfigError("model.prefix_cache_gb must be >= 0")


@dataclass
class EnvConfig:
    name: str = config_field("minishop", "built-in env (minishop, math, python) or "
                                         "'package.module:Class' (an Env subclass, or a TRL "
                                         "environment_factory class)")
    kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={HELP: "extra keyword arguments of the env constructor"}
    )
    dataset: str | None = config_field(None, "a TRL environment's tasks: a JSONL, CSV or parquet "
                                             "file or a saved dataset folder, one task per row; "
                                             "null: none")
    reward_fn: str | None = config_field(None, "a TRL environment without get_reward(): its "
                                               "reward function, 'package.module:function'; "
                                               "null: get_reward()")
    train_tasks: int = config_field(32, "tasks of the train split (searched, mined, trained on)")
    test_tasks: int = config_field(16, "tasks of the test split (held out for evaluation)")
    val_tasks: int = config_field(0, "validation tasks (train.select: val): the env's train tasks "
                                     "after the first train_tasks, disjoint from train and test; "
                                     "0: none")

    def __post_init__(self):
        if self.name not in BUILTIN_ENVS and ":" not in self.name:
            raise ConfigError(f"env.name must be one of {', '.join(BUILTIN_ENVS)} or "
                              f"'package.module:Class', got {self.name!r}")
        if min(self.train_tasks, self.test_tasks, self.val_tasks) < 0:
            raise ConfigError("env.train_tasks, env.test_tasks and env.val_tasks must be >= 0")


@dataclass
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    mine: MineConfig = field(default_factory=MineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        for key, select in (("train.select", self.train.select),
                            ("grpo.select", self.grpo.select)):
            if select == "val" and self.env.val_tasks < 1:
                raise ConfigError(f"{key}=val needs validation tasks: set env.val_tasks "
                                  "(e.g. 32)")
        g = self.grpo
        if g.enabled and g.init != "base" and g.init not in self.train.policies:
            raise ConfigError(f"grpo.init={g.init} is not in train.policies {self.train.policies}: "
                              "GRPO starts from a policy the train stage trains (or base)")
        if g.enabled and self.model.constrain != "none" and self.model.backend != "hf":
            raise ConfigError("grpo.enabled with model.constrain=tools needs model.backend=hf: "
                              "GRPO's ratio replays the hf decoder's grammar masks, and vLLM's "
                              "structured outputs mask without its closing steer "
                              "(docs/training.md)")

    # ---- building ----------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
        """YAML file (or nothing: defaults), then `key=value` overrides."""
        data: dict = {}
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file {path} does not exist")
            try:
                data = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{path} is not valid YAML: {e}") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{path} must hold a mapping of sections")
        for item in overrides:
            apply_override(data, item)
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        return _build(cls, moved(data), "")

    # ---- reading -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def hashed(self, sections: Sequence[str]) -> dict[str, Any]:
        """The part of the config a stage's results depend on (`unhashed_keys()` left out)."""
        full, skip = self.to_dict(), unhashed_keys()
        out = {}
        for section in sorted(sections):
            if section not in full:
                raise KeyError(f"unknown config section {section!r}")
            out[section] = {k: v for k, v in full[section].items() if f"{section}.{k}" not in skip}
        return out

    def hash(self, sections: Sequence[str]) -> str:
        return digest(self.hashed(sections))


def moved(data: dict) -> dict:
    """A config with keys since moved read at their new place (`data` is not changed):
    train.report_to (none | tensorboard, the train stage only) is run.report_to (a list,
    every stage), so old configs and run directories load."""
    train, run = data.get("train"), data.get("run", {})
    if not (isinstance(train, dict) and "report_to" in train and isinstance(run, dict)
            and isinstance(run.get("report_to", []), list)):
        return data
    old, trackers = train["report_to"], list(run.get("report_to", []))
    if old != "none" and old not in trackers:
        trackers.append(old)
    return {**data, "train": {k: v for k, v in train.items() if k != "report_to"},
            "run": {**run, "report_to": trackers}}


def digest(hashed: dict[str, Any]) -> str:
    """Stable across processes and key order: sha256 of canonical JSON, 16 hex digits."""
    text = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def unhashed_keys() -> set[str]:
    """`section.key` of every field marked `hashed=False`: keys that say how or where work
    runs, not what it computes, left out of stage hashes so that renaming a run or merging
    shards never invalidates finished stages."""
    hints = get_type_hints(RunConfig)
    return {f"{s.name}.{f.name}" for s in fields(RunConfig) for f in fields(hints[s.name])
            if not is_hashed(f)}


def make_env(cfg: RunConfig) -> Env:
    """A fresh env of the run: what every stage and command that steps or reads tasks uses.
    An env.name that names no env class, or env.kwargs its constructor refuses, is a
    ConfigError (one line), as a bad config key is."""
    try:
        return build_env(cfg.env.name, cfg.env.dataset, cfg.env.reward_fn, seed=cfg.run.seed,
                         **cfg.env.kwargs)
    except ValueError as e:  # ShapeError is one
        raise ConfigError(str(e)) from None


def apply_override(data: dict, item: str) -> None:
    """Apply one `a.b.c=value` (value parsed as a YAML scalar) to a nested dict in place."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {item!r}")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from None
    parts = key.strip().split(".")
    if len(parts) < 2:
        raise ConfigError(f"--set {key}: keys look like section.field, e.g. search.k=8")
    node = data
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key '{'.'.join(parts[: i + 1])}' is not a mapping")
    node[parts[-1]] = value


def diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Flattened differences `key: old -> new` between two nested config dicts."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def help_lines(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """`section.key = default  help` for every field, for --help."""
    lines = []
    hints = get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            lines += help_lines(hints[f.name], f"{prefix}{f.name}.")
        else:
            default = f.default if f.default_factory is MISSING else f.default_factory()
            lines.append(f"  {prefix}{f.name} = {default!r}  {f.metadata.get(HELP, '')}")
    return lines


def _build(cls: type, data: Any, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"config key '{prefix.rstrip('.') or '<root>'}' must be a mapping")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(names)}"
            raise ConfigError(f"unknown config key '{prefix}{key}' ({hint})")
    kwargs = {}
    for name, value in data.items():
        kind = hints[name]
        if is_dataclass(kind):
            kwargs[name] = _build(kind, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _check(value, kind, f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a section's own validation
        raise ConfigError(str(e)) from None


_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _check(value: Any, kind: Any, key: str) -> Any:
    """Return `value` if it fits the annotation `kind`, else raise ConfigError naming `key`."""
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        options = get_args(kind)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(value, option, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}' must be {_name(kind)}, got {value!r}")
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
        or (isinstance(v, str) and bool(_FLOAT.match(v))),  # YAML reads 1e-3 as a string
        str: lambda v: isinstance(v, str),
        dict: lambda v: isinstance(v, dict),
        list: lambda v: isinstance(v, list),
    }
    base = origin or kind
    if base is Any:
        return value
    if base not in ok:
        raise TypeError(f"config key '{key}': unsupported annotation {kind!r}")
    if not ok[base](value):
        raise ConfigError(f"config key '{key}' must be {_name(kind)}, got {value!r}")
    return float(value) if base is float else copy.deepcopy(value)


def _name(kind: Any) -> str:
    if get_origin(kind) in (Union, types.UnionType):
        return " or ".join(_name(a) for a in get_args(kind))
    if kind is type(None):
        return "null"
    base = get_origin(kind) or kind
    return {dict: "a mapping", list: "a list"}.get(base, getattr(base, "__name__", str(base)))

"""Optional dependencies: a feature that needs one names the extra that installs it."""

from __future__ import annotations

import importlib
import importlib.util

EXTRAS = {  # module -> (extra, what needs it); pyproject.toml's [project.optional-dependencies]
    "bitsandbytes": ("qlora", "train.quantization=4bit (QLoRA)"),
    "matplotlib": ("report", "the report stage's charts"),
    "networkx": ("tree", "`offline-agent tree`"),
    "tensorboard": ("tensorboard", "run.report_to: tensorboard"),
    "trackio": ("trackio", "run.report_to: trackio"),
    "wandb": ("wandb", "run.report_to: wandb"),
}


class MissingExtra(ImportError):
    pass


def missing(module: str) -> str | None:
    """The one-line error for `module` when it is not installed, else None (nothing is
    imported: the runner asks before a run)."""
    return None if importlib.util.find_spec(module) is not None else _message(module)


def require(module: str):
    """Import `module`, or raise MissingExtra naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(_message(module)) from None


def _message(module: str) -> str:
    extra, feature = EXTRAS[module]
    return f"{feature} needs {module}, which is not installed: pip install 'offline-agent[{extra}]'"

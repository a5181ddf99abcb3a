"""benchmarks/_counters.py, the pure parts: the never-evicting prefix set, a packed trie's
prefixes read back from its mask, the forward hook's prefill/pad/decode split, exclusive time."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from offline_agent.training.logprobs import Encoded, pack

_spec = importlib.util.spec_from_file_location(
    "_counters", Path(__file__).resolve().parents[1] / "benchmarks" / "_counters.py")
counters = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("_counters", counters)  # dataclasses look their module up
_spec.loader.exec_module(counters)


def test_prefix_set_counts_only_prefixes_never_seen():
    seen = counters.PrefixSet()
    assert seen.add([1, 2, 3]) == 3
    assert seen.add([1, 2, 4]) == 1  # [1], [1, 2] were computed already
    assert seen.add([1, 2]) == 0
    assert seen.add([2, 1]) == 2  # same tokens, other prefixes
    assert seen.add([1, 2, 3, 5, 6]) == 2
    assert len(seen) == 8


def test_counts_recomputed_is_what_was_forwarded_beyond_the_needed():
    c = counters.Counts(prefill_tokens=90, decode_tokens=10, needed=70)
    assert (c.forwarded, c.recomputed) == (100, 30)
    assert counters.Counts(prefill_tokens=5, needed=9).recomputed == 0


def packed_inputs(seqs: list[list[int]]):
    """The packed trie whose inputs are exactly `seqs`: each is followed by one action token,
    which is predicted, not forwarded (logprobs.pack)."""
    return pack([Encoded([*s, 0], [0] * len(s) + [1]) for s in seqs])


def test_packed_trie_gives_back_the_prefixes_of_its_sequences():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 7], [8, 2, 3]]
    packed = packed_inputs(seqs)
    from_mask = counters.PrefixSet()
    new = counters.add_packed(from_mask, packed.ids[0].tolist(), packed.positions[0].tolist(),
                              packed.allowed)
    plain = counters.PrefixSet()
    assert new == sum(plain.add(s) for s in seqs) == len(packed.ids[0]) == 10
    assert all(from_mask.add(s) == 0 for s in seqs)  # the very same prefixes, nothing more
    assert from_mask.add([1, 2, 9]) == 1


class Echo(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None, **kwargs):
        return input_ids


def test_forward_counter_splits_prefill_pad_and_decode():
    clock, counts = counters.Clock(), counters.Counts()
    model = Echo()
    hooks = counters.ForwardCounter(model, clock, counts)
    left_padded = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    model(torch.zeros(2, 3, dtype=torch.long), attention_mask=left_padded)  # 3 new columns
    model(torch.zeros(2, 1, dtype=torch.long), attention_mask=torch.ones(2, 5))
    model(torch.zeros(1, 1, dtype=torch.long))
    hooks.remove()
    model(torch.zeros(4, 1, dtype=torch.long))  # not counted any more
    assert (counts.prefill_calls, counts.prefill_tokens, counts.pad_slots) == (1, 5, 1)
    assert (counts.decode_steps, counts.decode_tokens, counts.decode_rows) == (2, 3, [2, 1])
    assert set(clock.totals) == {"model", counters.BENCH}


def test_forward_counter_reads_training_prefixes_from_the_forward():
    counts, seen = counters.Counts(), counters.PrefixSet()
    model = Echo()
    counters.ForwardCounter(model, counters.Clock(), counts, seen)
    packed = packed_inputs([[1, 2, 3], [1, 2, 4]])
    bias = torch.zeros(packed.allowed.shape).masked_fill(~packed.allowed, -1e9)
    model(input_ids=packed.ids, attention_mask=bias[None, None], position_ids=packed.positions)
    model(input_ids=torch.tensor([[0, 1, 2, 5]]), attention_mask=torch.tensor([[0, 1, 1, 1]]))
    assert counts.prefill_tokens == 4 + 3
    assert counts.needed == 4 + 1  # the second forward only adds [1, 2, 5]
    assert counts.recomputed == 2


def test_clock_time_is_exclusive_and_bench_work_is_not_split(monkeypatch):
    now = iter(range(100))
    monkeypatch.setattr(counters.time, "perf_counter", lambda: float(next(now)))
    clock = counters.Clock()
    inner = clock.wrap(lambda: None, "env")
    with clock.section("other"):  # t=0
        inner()  # env 1 -> 2
        with clock.section(counters.BENCH):  # 3
            inner()  # paused: no tick, stays bench
        # bench ends at 4
    # other ends at 5
    assert dict(clock.totals) == {"env": 1.0, counters.BENCH: 1.0, "other": 3.0}


def test_patches_time_methods_and_put_them_back():
    class Env:
        def act(self):
            return "done"

    original = Env.act
    patches = counters.Patches(counters.Clock())
    patches.time_class(Env, "env")
    assert Env.act is not original and Env().act() == "done"
    assert patches.clock.totals["env"] >= 0
    patches.restore()
    assert Env.act is original


@pytest.mark.parametrize("seqs", [[[3]], [[3, 4], [3, 4]]])
def test_packed_parents_of_roots_are_minus_one(seqs):
    packed = packed_inputs(seqs)
    parents = counters.packed_parents(packed.positions[0].tolist(), packed.allowed)
    assert parents[0] == -1 and parents == [-1, 0][:len(packed.ids[0])]

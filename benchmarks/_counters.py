"""Counters that watch a stage from outside: what the model computed, what it need not have,
and where the wall time went. Used by benchmarks/throughput.py.

Nothing here needs the code under test to cooperate, so the same counters measure today's
backend and tomorrow's:

- `ForwardCounter` hooks the causal LM module (torch forward hooks): every forward's rows,
  width and real tokens (a 2D attention mask's ones in the new columns; the rest is pad),
  a width-1 forward being a decode step and a wider one a prefill.
- `CallCounter` wraps a policy's `sample` and `choice_logprobs`: it encodes their prompts the
  way the contract says backends do (`encode_prompt`, choices tokenized apart) and adds every
  sequence the model had to see into a `PrefixSet` that is never evicted. The tokens a
  perfect prefix cache would have computed are the new prefixes; whatever the model forwarded
  beyond that was recomputed (or padding, counted apart). A new Policy entry point (a
  streaming or continuous-batching call) needs its wrapper here: until then its stage shows
  policy_calls 0 and every forwarded token as recomputed, which is hard to miss.
- For training forwards (no KV cache) the hooks read each token's prefix from the forward
  itself: a packed prefix trie's 4D mask gives each token's parent, a 2D mask gives plain rows.
- `Clock` splits wall time into exclusive categories (model, policy, tokenizer, env, duckdb,
  ...; a category's time excludes the categories called inside it). The counters' own work
  runs under "bench", which the stages subtract from their wall time.
"""

from __future__ import annotations

import time
import types
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

BENCH = "bench"  # the counters' own work: excluded from a stage's wall time


class PrefixSet:
    """Every token prefix ever added, as a trie of (parent node, token) -> node (0 is the
    root). Unbounded: it stands for a prefix cache that never evicts."""

    def __init__(self):
        self._nodes: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def child(self, node: int, token: int) -> tuple[int, bool]:
        """The node of prefix `node` + `token`, and whether it is new."""
        key = (node, token)
        found = self._nodes.get(key)
        if found is not None:
            return found, False
        self._nodes[key] = len(self._nodes) + 1
        return self._nodes[key], True

    def add(self, ids: list[int]) -> int:
        """Add every prefix of `ids`; returns how many were new (tokens a cache would compute)."""
        node, new = 0, 0
        for token in ids:
            node, fresh = self.child(node, token)
            new += fresh
        return new


def packed_parents(positions: list[int], allowed) -> list[int]:
    """Parent of each token of a packed prefix trie (-1 for a root), from its positions and
    its (L, L) bool attention mask: the attended token one position earlier."""
    import torch

    pos = torch.as_tensor(positions)
    previous = allowed & (pos[None, :] == pos[:, None] - 1)
    parents = previous.float().argmax(1)
    return torch.where(previous.any(1), parents, torch.full_like(parents, -1)).tolist()


def add_packed(prefixes: PrefixSet, tokens: list[int], positions: list[int], allowed) -> int:
    """Add the prefixes of a packed trie row; returns how many were new."""
    parents = packed_parents(positions, allowed)
    node_of: dict[int, int] = {}
    new = 0
    for i in sorted(range(len(tokens)), key=positions.__getitem__):  # parents first
        parent = node_of[parents[i]] if parents[i] >= 0 else 0
        node_of[i], fresh = prefixes.child(parent, tokens[i])
        new += fresh
    return new


class Clock:
    """Exclusive wall time per category: time in a section minus the sections inside it."""

    def __init__(self):
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []  # [category, start, time of nested sections]

    @property
    def paused(self) -> bool:
        """Inside the counters' own work: nested wrappers do not split it further."""
        return bool(self._stack) and self._stack[-1][0] == BENCH

    def enter(self, category: str) -> None:
        self._stack.append([category, time.perf_counter(), 0.0])

    def exit(self) -> None:
        category, start, nested = self._stack.pop()
        elapsed = time.perf_counter() - start
        self.totals[category] += elapsed - nested
        if self._stack:
            self._stack[-1][2] += elapsed

    @contextmanager
    def section(self, category: str):
        self.enter(category)
        try:
            yield
        finally:
            self.exit()

    def wrap(self, fn, category: str):
        def timed(*args, **kwargs):
            if self.paused:
                return fn(*args, **kwargs)
            with self.section(category):
                return fn(*args, **kwargs)
        timed.__wrapped__ = fn
        return timed


class Patches:
    """Attributes replaced for a measurement, put back by `restore`."""

    def __init__(self, clock: Clock):
        self.clock, self._undo = clock, []

    def replace(self, owner, name: str, value) -> None:
        had = name in vars(owner)
        self._undo.append((owner, name, vars(owner)[name] if had else None, had))
        setattr(owner, name, value)

    def time(self, owner, name: str, category: str) -> None:
        """Time `owner.name` (a method looked up through the class) under `category`."""
        self.replace(owner, name, self.clock.wrap(getattr(owner, name), category))

    def time_class(self, cls, category: str) -> None:
        """Time every plain method (not dunders) `cls` and its bases define, in place."""
        for klass in cls.__mro__[:-1]:  # not object
            for name, attr in list(vars(klass).items()):
                if isinstance(attr, types.FunctionType) and not name.startswith("__"):
                    self.time(klass, name, category)

    def restore(self) -> None:
        while self._undo:
            owner, name, value, had = self._undo.pop()
            if had:
                setattr(owner, name, value)
            else:
                delattr(owner, name)


@dataclass
class Counts:
    """What one stage made the model compute."""

    prefill_calls: int = 0
    prefill_tokens: int = 0  # real tokens of forwards wider than one token
    pad_slots: int = 0  # padded positions those forwards computed as well
    decode_steps: int = 0
    decode_tokens: int = 0  # rows of width-1 forwards
    decode_rows: list[int] = field(default_factory=list)  # rows of each decode step
    needed: int = 0  # tokens a never-evicting prefix cache would have computed
    prefill_seconds: float = 0.0  # inside the model, in prefill forwards
    decode_seconds: float = 0.0  # inside the model, in decode steps
    calls: int = 0  # policy calls (sample, choice_logprobs)
    generated: int = 0  # completion tokens returned

    @property
    def forwarded(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @property
    def recomputed(self) -> int:
        return max(0, self.forwarded - self.needed)


class ForwardCounter:
    """Forward hooks on a causal LM module: counts its inputs and times it as "model".
    `prefixes` (training forwards, no KV cache): also add each forward's token prefixes."""

    def __init__(self, module, clock: Clock, counts: Counts, prefixes: PrefixSet | None = None):
        self.clock, self.counts, self.prefixes = clock, counts, prefixes
        self._handles = [module.register_forward_pre_hook(self._before, with_kwargs=True),
                         module.register_forward_hook(self._after)]

    def _before(self, module, args, kwargs):
        self.clock.enter(BENCH)
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        rows, width = ids.shape
        real = rows * width
        if mask is not None and mask.dim() == 2:
            real = int(mask[:, -width:].sum())
        c = self.counts
        if width == 1:
            c.decode_steps += 1
            c.decode_tokens += real
            c.decode_rows.append(real)
        else:
            c.prefill_calls += 1
            c.prefill_tokens += real
            c.pad_slots += rows * width - real
        if self.prefixes is not None:
            c.needed += self._new_prefixes(ids, mask, kwargs.get("position_ids"))
        self.clock.exit()
        self._decode, self._start = width == 1, time.perf_counter()
        self.clock.enter("model")

    def _after(self, module, args, output):
        self.clock.exit()
        elapsed = time.perf_counter() - self._start
        if self._decode:
            self.counts.decode_seconds += elapsed
        else:
            self.counts.prefill_seconds += elapsed

    def _new_prefixes(self, ids, mask, positions) -> int:
        import torch

        if mask is not None and mask.dim() == 4:  # a packed trie: bias or bool (B, 1, L, L)
            allowed = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0
            pos = (positions[0] if positions is not None else torch.arange(ids.shape[1]))
            return add_packed(self.prefixes, ids[0].tolist(), pos.tolist(), allowed.cpu())
        new = 0
        for r, row in enumerate(ids.tolist()):
            keep = mask[r].tolist() if mask is not None else [1] * len(row)
            new += self.prefixes.add([t for t, m in zip(row, keep) if m])
        return new

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


class CallCounter:
    """Wraps a policy's sample and choice_logprobs (time: "policy") and adds what each call
    needed the model to see to `prefixes`: every row's prompt and its completion but the last
    token (never fed back), every choice's prompt and choice but its last token."""

    def __init__(self, policy, clock: Clock, counts: Counts, patches: Patches,
                 prefixes: PrefixSet):
        from offline_agent.policy.base import encode_prompt

        self.encode = lambda p: encode_prompt(policy.tokenizer, p)
        self.tokenizer, self.clock, self.counts, self.prefixes = (
            policy.tokenizer, clock, counts, prefixes)
        sample, choice_logprobs = policy.sample, policy.choice_logprobs

        def counted_sample(prompts, n, sampling):
            with clock.section("policy"):
                out = sample(prompts, n, sampling)
            with clock.section(BENCH):
                counts.calls += 1
                for ids, completions in zip(map(self.encode, prompts), out):
                    for c in completions:
                        self._add(ids + c.token_ids[:-1])
                        counts.generated += len(c.token_ids)
            return out

        def counted_choices(prompts, choices):
            with clock.section("policy"):
                out = choice_logprobs(prompts, choices)
            with clock.section(BENCH):
                counts.calls += 1
                for ids, cs in zip(map(self.encode, prompts), choices):
                    for c in cs:
                        self._add(ids + self.tokenizer(c, add_special_tokens=False).input_ids[:-1])
            return out

        patches.replace(policy, "sample", counted_sample)
        patches.replace(policy, "choice_logprobs", counted_choices)
        # Policy.serve (continuous batching across turns) exists from commit 4f1bec2 on; the
        # benchmark also measures the code before it, whose run_episodes calls sample
        if "serve" in type(policy).__dict__:
            self._count_serve(policy, patches)

    def _count_serve(self, policy, patches: Patches) -> None:
        serve, clock, counts = policy.serve, self.clock, self.counts

        def counted_serve(requests, sampling, answer):
            def counted_answer(request, completion):
                with clock.section(BENCH):
                    self._add(self.encode(request.prompt) + completion.token_ids[:-1])
                    counts.generated += len(completion.token_ids)
                return answer(request, completion)

            counts.calls += 1
            with clock.section("policy"):
                return serve(requests, sampling, counted_answer)

        patches.replace(policy, "serve", counted_serve)

    def _add(self, ids: list[int]) -> None:
        self.counts.needed += self.prefixes.add(ids)


class Watch:
    """Everything above around one stage: `with Watch(...) as w: run()`, then w.figures().

    module: the causal LM whose forwards count. policy: a Policy whose calls are counted
    (inference; None for training, where the forwards carry the prefixes themselves).
    timed: (class, category) pairs whose methods are timed (env, tokenizer, store, ...).
    methods: (owner, name, category) single methods to time (backward, optimizer step)."""

    def __init__(self, module, policy=None, timed=(), methods=()):
        self.clock, self.counts, self.prefixes = Clock(), Counts(), PrefixSet()
        self.patches = Patches(self.clock)
        self._setup = (module, policy, timed, methods)

    def __enter__(self):
        module, policy, timed, methods = self._setup
        for cls, category in timed:
            if cls is not None:
                self.patches.time_class(cls, category)
        for owner, name, category in methods:
            self.patches.time(owner, name, category)
        if policy is not None:
            CallCounter(policy, self.clock, self.counts, self.patches, self.prefixes)
        self.forwards = ForwardCounter(module, self.clock, self.counts,
                                       None if policy is not None else self.prefixes)
        self.clock.enter("other")
        return self

    def __exit__(self, *exc):
        self.clock.exit()
        self.forwards.remove()
        self.patches.restore()

    @property
    def wall(self) -> float:
        """The stage's wall time without the counters' own work."""
        return sum(self.clock.totals.values()) - self.clock.totals[BENCH]

    def seconds(self) -> dict[str, float]:
        return {k: v for k, v in self.clock.totals.items() if k != BENCH}

"""transformers backend: batched sampling and scoring on CPU or GPU.

A short decode loop of our own instead of `model.generate`, because it gives us four things
that generate does not, cheaply:

- Each row (prompt i, sample j) draws from its own generator seeded by (call seed, row index),
  so a sample does not depend on which other rows shared its batch or how rows were chunked.
- The log-prob of every sampled token under the model's raw distribution (temperature 1,
  no top-p) comes with the logits we already have. GRPO's ratio and KL need exactly these.
- On CPU, prefilling long histories costs more than decoding a short action. Prompts share a long prefix (system prompt, tool descriptions),
  the n samples of a prompt share the whole prompt, and the next step of an episode extends
  the last one. So each distinct prompt is computed once, only past the longest prefix the
  PrefixCache holds from earlier calls, and the KV cache is then expanded to the n rows.
- Rows end at different steps (eos, stop strings). A finished row's slot takes the next
  pending row (the rest of a call past max_batch, or through `serve` the next request, e.g.
  an episode's next turn): its prompt is prefilled and merged into the running cache
  (kv_buffer.insert_rows), so the batch stays full. A finished row with none to replace it
  stays in the batch, its tokens ignored, until COMPACT_AT of the KV a step reads is dead;
  then one copy drops the dead rows and the left pad no live row needs.

With constrain="tools", a row asked with tools decodes under the grammar of one tool call
(policy/grammar.py, policy/constrained.py): its own xgrammar matcher masks the logits it
samples or argmaxes from; log-probs stay those of the raw logits. It ends at end-of-turn or at
a stop string after the call (free text holds none of the grammar's stop strings).

The cache is padded in the middle: [left pad][cached prefix][left pad][new tokens]. The
attention mask hides the pad, and position ids count only real tokens. This is for
decoder-only models with full attention (Llama, Qwen2, SmolLM, ...).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from ..cpu_dtype import warn_if_emulated_bf16
from .adapters import merge_adapter
from .attention import use_gqa_sdpa
from .base import (
    Answer,
    Completion,
    Request,
    Sampling,
    call_rows,
    encode_prompt,
    make_completion,
    row_seed,
)
from .choices import choice_tree
from .grammar import CallGrammar, prompt_grammars
from .kv_buffer import HEADROOM, insert_rows, new_cache, select_rows
from .linear import use_onednn_linear
from .models import resolve_model
from .prefix_cache import PrefixCache

# Finished rows stay in the decode batch until this share of the KV it reads is dead (rows
# gone, left pad no live row needs); then one copy drops it (benchmarks/decode_levers.py).
COMPACT_AT = 0.25
if TYPE_CHECKING:
    from .constrained import RowState

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _common_prefix(seqs: list[list[int]]) -> int:
    n = 0
    for column in zip(*seqs):
        if any(t != column[0] for t in column):
            break
        n += 1
    return n


class HFPolicy:
    """The Policy contract on a transformers causal LM. See the module docstring for the design."""

    def __init__(self, model, tokenizer, max_batch: int = 32, seed: int = 0,
                 prefix_cache_gb: float = 2.0, constrain: str = "none"):
        """`model` is used as it is: from_pretrained puts it in eval mode; a caller passing a model
        it trains (GRPO) does so itself and calls clear_cache() after each update."""
        self.model = model
        use_gqa_sdpa(model)  # the same attention without copying K/V per query head
        use_onednn_linear(model)  # CPU float32 inference: oneDNN's linear beats MKL's (linear.py)
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.max_batch = max_batch
        self.device = model.device
        eos = model.generation_config.eos_token_id
        self.eos = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
        self._rng = torch.Generator().manual_seed(seed)  # seeds calls whose Sampling.seed is None
        self.prefix_cache = PrefixCache(max_bytes=int(prefix_cache_gb * 2**30))
        self.num_layers = model.config.get_text_config().num_hidden_layers
        self.grammars = None  # compiles and masks tool-call grammars (constrain="tools")
        if constrain == "tools":
            from .constrained import GrammarMasks

            vocab = model.get_output_embeddings().weight.shape[0]
            self.grammars = GrammarMasks(tokenizer, vocab, sorted(self.eos))

    @classmethod
    def from_pretrained(cls, model_id: str, device: str = "auto", dtype: str = "auto",
                        adapter: str | None = None, max_batch: int = 32, seed: int = 0,
                        prefix_cache_gb: float = 2.0, constrain: str = "none"):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
        warn_if_emulated_bf16(DTYPES[dtype], device, "model.dtype")
        path = resolve_model(model_id)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()
        if adapter:  # merged: sampling runs at the base model's speed
            model = merge_adapter(model, adapter)
        return cls(model, tokenizer, max_batch=max_batch, seed=seed,
                   prefix_cache_gb=prefix_cache_gb, constrain=constrain)

    def clear_cache(self) -> None:
        """Forget the kept prefix KV. Call this after changing the model's weights in place."""
        self.prefix_cache = PrefixCache(self.prefix_cache.block_size, self.prefix_cache.max_bytes)

    @torch.inference_mode()
    def sample(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[Completion]]:
        """n completions per prompt. Completion.logprobs are under the raw model (temperature 1,
        no top-p), whatever the sampling settings."""
        rows, seeds, temperatures = call_rows(self.tokenizer, prompts, n, sampling, self._rng)
        grammars = [g for g in self._grammars(sampling, len(prompts)) for _ in range(n)]
        out: list[Completion | None] = [None] * len(rows)

        def keep(row: _Row, completion: Completion) -> list[_Row]:
            out[row.tag] = completion
            return []

        self._generate(deque(_Row(*r, tag=i) for i, r in enumerate(
            zip(rows, seeds, temperatures, grammars))), sampling, keep)
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]  # type: ignore[misc]

    @torch.inference_mode()
    def serve(self, requests: list[Request], sampling: Sampling, answer: Answer) -> None:
        """Policy.serve with continuous batching: a request `answer` returns takes the first
        free row of the running decode (see _generate)."""
        if not isinstance(sampling.temperature, (int, float)):
            raise ValueError("serve takes one temperature for all requests")

        def row(r: Request) -> _Row:
            grammar = self._grammars(replace(sampling, tools=[r.tools]), 1)[0]
            return _Row(encode_prompt(self.tokenizer, r.prompt), row_seed(r.seed, 0),
                        float(sampling.temperature), grammar, tag=r)

        def on_done(done: _Row, completion: Completion) -> list[_Row]:
            return [row(r) for r in answer(done.tag, completion)]

        self._generate(deque(map(row, requests)), sampling, on_done)

    def _grammars(self, sampling: Sampling, num_prompts: int) -> list[CallGrammar | None]:
        """Each prompt's tool-call grammar; all None unless constrain="tools"."""
        if self.grammars is None:
            return [None] * num_prompts
        return prompt_grammars(sampling, num_prompts)

    def score(self, prompt: str, continuations: list[str]) -> list[float]:
        """Summed log-prob of each continuation after the prompt (see choice_logprobs)."""
        return self.choice_logprobs([prompt], [continuations])[0]

    @torch.inference_mode()
    def choice_logprobs(self, prompts: list[str], choices: list[list[str]]) -> list[list[float]]:
        """For each prompt, the summed log-prob of each of its choices as the continuation.

        Prompt and choice are tokenized apart and their ids concatenated, as in generation.
        Each chunk of max_batch distinct prompts costs one prefill (common prefix once, past
        the prefix cache) and one forward of one row per prompt: its last token, then every
        choice's tokens but the last, each choice attending to the prompt and to its own
        earlier tokens only (policy/choices.py). No prompt KV is copied per choice, and a
        single-token choice (the critic's labels) is read from the last token's logits.
        """
        ids = [tuple(encode_prompt(self.tokenizer, p)) for p in prompts]
        encoded = [[tuple(self.tokenizer(c, add_special_tokens=False).input_ids) for c in cs]
                   for cs in choices]
        distinct: dict[tuple[int, ...], dict[tuple[int, ...], None]] = {}
        for p, cs in zip(ids, encoded):  # a repeated prompt or choice is scored once
            distinct.setdefault(p, {}).update(dict.fromkeys(cs))
        rows = [(p, list(cs)) for p, cs in distinct.items() if cs]
        scores: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
        for start in range(0, len(rows), self.max_batch):
            chunk = rows[start:start + self.max_batch]
            got = self._score_rows([list(p) for p, _ in chunk], [cs for _, cs in chunk])
            for (p, cs), values in zip(chunk, got):
                scores.update({(p, c): v for c, v in zip(cs, values)})
        return [[scores[p, c] for c in cs] for p, cs in zip(ids, encoded)]

    def _score_rows(self, rows: list[list[int]], choices: list[list[tuple[int, ...]]]):
        """Summed log-probs of each row's choices (token ids) after the row (distinct prompts)."""
        cache, mask = self._prefill(rows)
        tree = choice_tree([r[-1] for r in rows], choices, self.tokenizer.pad_token_id)
        length = mask.shape[1]
        attend = torch.cat([mask.bool()[:, None, None, :].expand(-1, 1, tree.width, length),
                            tree.mask[:, None].to(self.device)], dim=-1)
        dtype = self.model.get_output_embeddings().weight.dtype  # additive: sdpa and eager
        additive = torch.zeros(attend.shape, dtype=dtype, device=self.device).masked_fill_(
            ~attend, torch.finfo(dtype).min)
        positions = mask.sum(1, keepdim=True) + tree.depth.to(self.device)
        hidden = self.model.get_decoder()(tree.tokens.to(self.device), attention_mask=additive,
                                          position_ids=positions, cache=cache).last_hidden_state
        at, which = tree.predictor.to(self.device).unique(return_inverse=True)
        logits = self.model.get_output_embeddings()(hidden.reshape(-1, hidden.shape[-1])[at])
        logp = logits.float().log_softmax(-1)[which, tree.target.to(self.device)]
        sums = torch.zeros(tree.num_choices, device=self.device).index_add_(
            0, tree.choice.to(self.device), logp).tolist()
        out, k = [], 0
        for cs in choices:
            out.append(sums[k:k + len(cs)])
            k += len(cs)
        return out

    def _generate(self, pending: deque[_Row], sampling: Sampling,
                  done: Callable[[_Row, Completion], list[_Row]]) -> None:
        """Decode every pending row, at most max_batch at a time, in one batched loop; each
        finished row goes to `done`, whose new rows join the queue. A finished row's slot
        takes the next pending row (its prompt prefilled, then merged into the running KV
        cache), so the batch stays full while rows are waiting; with none waiting, finished
        rows stay in the batch (their tokens are ignored) until dropping them saves more than
        the copy costs (COMPACT_AT). A row with a grammar draws only tokens its matcher allows
        (greedy too), and ends when the matcher has accepted end-of-turn after the call."""
        batch = _Batch()
        while pending or batch.alive():
            free = batch.free(self.max_batch)
            if pending and free:
                self._admit(batch, [pending.popleft() for _ in range(min(len(free), len(pending)))],
                            free)
            if batch.waste() > COMPACT_AT:
                batch.compact()
            for row, completion in self._step(batch, sampling):
                pending.extend(done(row, completion))

    def _admit(self, batch: _Batch, rows: list[_Row], slots: list[int]) -> None:
        """Prefill `rows` and put them into `slots` of the running batch."""
        cache, mask = self._prefill([r.ids for r in rows])
        states = [_Decoding(r, torch.Generator(self.device).manual_seed(r.seed), m)
                  for r, m in zip(rows, self.grammars.rows([r.grammar for r in rows])
                                  if self.grammars else [None] * len(rows))]
        last = torch.tensor([r.ids[-1] for r in rows], device=self.device)
        temps = torch.tensor([r.temperature for r in rows], device=self.device)
        if batch.cache is None:
            batch.cache, batch.mask, batch.last, batch.temps = cache, mask, last, temps
            batch.slots = list(states)
            return
        slots = slots[:len(rows)]
        batch.mask = insert_rows(batch.cache, batch.mask, slots, cache, mask)
        grow = len(batch.mask) - len(batch.slots)
        batch.slots += [None] * grow
        batch.last = torch.cat([batch.last, batch.last.new_zeros(grow)])
        batch.temps = torch.cat([batch.temps, batch.temps.new_zeros(grow)])
        index = torch.tensor(slots, device=self.device)
        batch.last[index], batch.temps[index] = last, temps
        for slot, state in zip(slots, states):
            batch.slots[slot] = state

    def _step(self, batch: _Batch, sampling: Sampling) -> list[tuple[_Row, Completion]]:
        """One decode step of the whole batch; returns the rows that finished with it."""
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.mask), 1)], dim=1)
        logits = self.model(batch.last[:, None], attention_mask=batch.mask,
                            position_ids=batch.mask.sum(1, keepdim=True) - 1, cache=batch.cache)
        logits, temps = logits.logits[:, -1].float(), batch.temps
        alive = batch.alive()
        if len(alive) < len(batch.slots):  # finished rows' logits are not drawn from
            index = torch.tensor(alive, device=self.device)
            logits, temps = logits[index], temps[index]
        rows = [batch.slots[i] for i in alive]
        generators = [r.generator for r in rows]
        matchers = [r.matcher for r in rows]
        if any(matchers):  # raw logits stay for the logprobs
            left = [sampling.max_new_tokens - len(r.ids) for r in rows]
            allowed = self.grammars.mask(logits, matchers, left=left)
            tokens = self.grammars.settle(_pick(allowed, generators, temps, sampling.top_p),
                                          matchers)
        else:
            tokens = _pick(logits, generators, temps, sampling.top_p)
        token_logprobs = logits.log_softmax(-1).gather(1, tokens[:, None])[:, 0].tolist()
        finished = []
        for i, slot, token, logprob in zip(alive, rows, tokens.tolist(), token_logprobs):
            slot.ids.append(token)
            slot.logprobs.append(logprob)
            m = slot.matcher
            if (self.grammars.advance(m, token) if m else self._stopped(slot.ids, sampling.stop)
                    ) or len(slot.ids) == sampling.max_new_tokens:
                batch.slots[i] = None
                finished.append((slot.row, self._finish(slot.ids, slot.logprobs,
                                                        m.grammar.stop if m else sampling.stop,
                                                        m is not None)))
        batch.last[torch.tensor(alive, device=self.device)] = tokens
        return finished

    def _finish(self, ids: list[int], logprobs: list[float], stop: list[str], constrained: bool):
        """A constrained reply is cut only at the stop strings its grammar allows after the call."""
        completion = make_completion(self.tokenizer, ids, logprobs, list(stop),
                                     bool(ids) and ids[-1] in self.eos)
        completion.constrained = constrained
        return completion

    def _stopped(self, ids: list[int], stop: list[str]) -> bool:
        if ids[-1] in self.eos:
            return True
        if not stop:
            return False
        text = self.tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        return any(s in text for s in stop)

    def _prefill(self, rows: list[list[int]]) -> tuple[DynamicCache, torch.Tensor]:
        """KV cache and attention mask of each row's prompt but its last token (the caller
        feeds that one). Each distinct prompt is computed once, and only past the longest
        prefix the prefix cache holds; a long prefix shared by the whole batch is computed
        once at batch 1 first. Layout per row: [left pad][cached prefix][left pad][new]."""
        where = {p: i for i, p in enumerate(dict.fromkeys(map(tuple, rows)))}
        contexts = [list(p[:-1]) for p in where]
        shared = _common_prefix(contexts) if len(contexts) > 1 else 0
        size = self.prefix_cache.block_size
        if self.prefix_cache.max_bytes and shared // size > len(self.prefix_cache.match(contexts[0][:shared])):
            self._extend([contexts[0][:shared]])
        cache, mask = self._extend(contexts)
        index = [where[tuple(r)] for r in rows]
        if index == list(range(len(contexts))):  # distinct rows: the cache is theirs as it is
            return cache, mask
        index = torch.tensor(index, device=self.device)
        cache.batch_select_indices(index)
        return cache, mask[index]

    def _extend(self, contexts: list[list[int]]) -> tuple[DynamicCache, torch.Tensor]:
        """The KV cache of `contexts` in one batch, computing only what the prefix cache lacks,
        and keeping the new whole blocks in it."""
        matched = [self.prefix_cache.match(c) for c in contexts]
        cached = [len(m) * self.prefix_cache.block_size for m in matched]
        past = max(cached)
        width = max(len(c) - m for c, m in zip(contexts, cached))
        mask = torch.zeros(len(contexts), past + width, dtype=torch.long, device=self.device)
        ids = torch.full((len(contexts), width), self.tokenizer.pad_token_id, device=self.device)
        for i, (c, m) in enumerate(zip(contexts, cached)):
            rest = c[m:]
            mask[i, past - m:past] = 1
            mask[i, past + width - len(rest):] = 1
            ids[i, width - len(rest):] = torch.tensor(rest, dtype=torch.long)
        buffers = None
        if past:  # the cached rows, written straight into buffers with room for the new tokens
            rows = [self.prefix_cache.gather(m) if m else None for m in matched]
            keys, _ = next(r for r in rows if r is not None)
            layers, heads, _, dim = keys.shape
            buffers = []
            for layer in range(layers):
                k = keys.new_zeros(len(contexts), heads, past + width + HEADROOM, dim)
                v = torch.zeros_like(k)
                for i, row in enumerate(rows):
                    if row is not None:
                        k[i, :, past - cached[i]:past] = row[0][layer]
                        v[i, :, past - cached[i]:past] = row[1][layer]
                buffers.append((k, v))
        cache = new_cache(self.num_layers, buffers, filled=past)
        if width:
            positions = (mask.cumsum(1) - 1).clamp(min=0)[:, past:]
            self.model(ids, attention_mask=mask, position_ids=positions, cache=cache,
                       logits_to_keep=1)
        for i, c in enumerate(contexts if self.prefix_cache.max_bytes else []):
            if len(c) // self.prefix_cache.block_size > len(matched[i]):
                # copy only the tokens past the cached blocks: their columns are the last
                # len(c) - cached[i] of the row (left pads come first)
                new = slice(past + width - (len(c) - cached[i]), past + width)
                self.prefix_cache.store(
                    c,
                    torch.stack([layer.keys[i][:, new] for layer in cache.layers]),
                    torch.stack([layer.values[i][:, new] for layer in cache.layers]),
                    start=cached[i])
        return cache, mask


@dataclass
class _Row:
    """One row of a decode: a prompt's ids, its seed, temperature and tool-call grammar;
    `tag` is the caller's, returned with the row when it is done."""

    ids: list[int]
    seed: int
    temperature: float
    grammar: CallGrammar | None
    tag: object = None


@dataclass
class _Decoding:
    """A row being decoded: its generator, its grammar's matcher, what it has drawn."""

    row: _Row
    generator: torch.Generator
    matcher: RowState | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class _Batch:
    """The running decode: KV cache and attention mask, each row's last token and
    temperature, and the row decoding in each slot (None: finished, the slot is free)."""

    cache: DynamicCache | None = None
    mask: torch.Tensor | None = None
    last: torch.Tensor | None = None
    temps: torch.Tensor | None = None
    slots: list[_Decoding | None] = field(default_factory=list)

    def alive(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s is not None]

    def free(self, max_batch: int) -> list[int]:
        """Slots a new row may take: finished ones, then room up to max_batch."""
        return [i for i, s in enumerate(self.slots) if s is None] + list(
            range(len(self.slots), max_batch))

    def waste(self) -> float:
        """Share of the KV cache a decode step reads for nothing: finished rows, and the
        left columns that are pad in every live row."""
        alive, (rows, width) = self.alive(), self.mask.shape
        if not alive or not width or len(alive) == rows and self.mask[:, 0].any():
            return 0.0
        start = int(self.mask[alive].argmax(1).min())
        return 1 - len(alive) * (width - start) / (rows * width)

    def compact(self) -> None:
        """Drop the finished rows and the left columns no live row needs (one copy)."""
        alive = self.alive()
        self.mask = select_rows(self.cache, self.mask, alive)
        index = torch.tensor(alive, device=self.mask.device)
        self.last, self.temps = self.last[index], self.temps[index]
        self.slots = [self.slots[i] for i in alive]


def _pick(logits: torch.Tensor, generators: list[torch.Generator], temperatures: torch.Tensor,
          top_p: float) -> torch.Tensor:
    """Next token per row: argmax where the row's temperature is 0, else one draw from the
    row's own generator."""
    greedy = logits.argmax(-1)
    if not temperatures.any():
        return greedy
    probs = (logits / temperatures.clamp(min=1e-6)[:, None]).softmax(-1)
    if top_p < 1:  # keep the smallest set of tokens whose mass reaches top_p
        sorted_probs, order = probs.sort(-1, descending=True)
        sorted_probs[sorted_probs.cumsum(-1) - sorted_probs > top_p] = 0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    # Inverse CDF with one uniform per row from its own generator: far cheaper on CPU than
    # torch.multinomial row by row. Zero-probability tokens are never picked (right=True).
    u = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in generators])
    cdf = probs.cumsum(-1)
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    picked = picked.clamp(max=probs.shape[-1] - 1)
    return torch.where(temperatures > 0, picked, greedy)

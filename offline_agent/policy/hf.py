"""transformers backend: batched sampling and scoring on CPU or GPU.

A short decode loop of our own instead of `model.generate`, because it gives us three things
that generate does not, cheaply:

- Each row (prompt i, sample j) draws from its own generator seeded by (call seed, row index),
  so a sample does not depend on which other rows shared its batch or how rows were chunked.
- The log-prob of every sampled token under the model's raw distribution (temperature 1,
  no top-p) comes with the logits we already have. GRPO's ratio and KL need exactly these.
- On CPU, prefilling long histories costs more than decoding a short action
  (benchmarks/generation.py). Prompts share a long prefix (system prompt, tool descriptions),
  the n samples of a prompt share the whole prompt, and the next step of an episode extends
  the last one. So each distinct prompt is computed once, only past the longest prefix the
  PrefixCache holds from earlier calls, and the KV cache is then expanded to the n rows.

With constrain="tools", a row asked with tools decodes under the grammar of one tool call
(policy/grammar.py, policy/constrained.py): its own xgrammar matcher masks the logits it
samples or argmaxes from; log-probs stay those of the raw logits. It ends at end-of-turn or at
a stop string after the call (free text holds none of the grammar's stop strings).

The cache is padded in the middle: [left pad][cached prefix][left pad][new tokens]. The
attention mask hides the pad, and position ids count only real tokens. This is for
decoder-only models with full attention (Llama, Qwen2, SmolLM, ...).
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from .adapters import merge_adapter
from .attention import use_gqa_sdpa
from .base import Completion, Sampling, call_rows, encode_prompt, make_completion
from .choices import choice_tree
from .grammar import CallGrammar, prompt_grammars
from .kv_buffer import HEADROOM, new_cache
from .models import resolve_model
from .prefix_cache import PrefixCache

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
        out: list[Completion] = []
        for start in range(0, len(rows), self.max_batch):
            end = start + self.max_batch
            out += self._generate(rows[start:end], seeds[start:end], temperatures[start:end],
                                  sampling, grammars[start:end])
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]

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

    def _generate(self, rows: list[list[int]], seeds: list[int], temperatures: list[float],
                  sampling: Sampling, grammars: list[CallGrammar | None]):
        """Sample one completion per row (a prompt's ids) in one batched decode loop. A row
        with a grammar draws only tokens its matcher allows (greedy too), and ends when the
        matcher has accepted end-of-turn after the call."""
        cache, mask = self._prefill(rows)
        last = torch.tensor([r[-1] for r in rows], device=self.device)
        generators = [torch.Generator(self.device).manual_seed(s) for s in seeds]
        temps = torch.tensor(temperatures, device=self.device)
        constrained = self.grammars.rows(grammars) if self.grammars else [None] * len(rows)
        ids: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        active = list(range(len(rows)))  # rows still generating, in batch order
        for step in range(sampling.max_new_tokens):
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
            logits = self.model(last[:, None], attention_mask=mask,
                                position_ids=mask.sum(1, keepdim=True) - 1, cache=cache)
            logits = logits.logits[:, -1].float()
            rows_now = [constrained[r] for r in active]
            if any(rows_now):  # raw logits stay for the logprobs
                allowed = self.grammars.mask(logits, rows_now, left=sampling.max_new_tokens - step)
                tokens = _pick(allowed, [generators[r] for r in active], temps, sampling.top_p)
                tokens = self.grammars.settle(tokens, rows_now)
            else:
                tokens = _pick(logits, [generators[r] for r in active], temps, sampling.top_p)
            token_logprobs = logits.log_softmax(-1).gather(1, tokens[:, None])[:, 0].tolist()
            keep = []
            for i, r in enumerate(active):
                ids[r].append(int(tokens[i]))
                logprobs[r].append(token_logprobs[i])
                row = constrained[r]
                if not (self.grammars.advance(row, ids[r][-1]) if row
                        else self._stopped(ids[r], sampling.stop)):
                    keep.append(i)
            if not keep:
                break
            if len(keep) < len(active):  # finished rows leave the batch
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, tokens, temps = mask[index], tokens[index], temps[index]
                active = [active[i] for i in keep]
            last = tokens
        return [self._finish(i, lp, m.grammar.stop if m else sampling.stop, m is not None)
                for i, lp, m in zip(ids, logprobs, constrained)]

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

"""vLLM backend (GPU): the same contract as HFPolicy, with vLLM's automatic prefix caching.

Each (prompt, sample) row is its own request. It carries the row seed the hf backend uses
(base.row_seeds), so a sample depends on (seed, row) only, whatever vLLM batches it with.
Prefix caching makes the repeated prompt and the shared system prompt nearly free. Prompts go in as token ids (encode_prompt),
so BOS is never doubled. The Completion is rebuilt from the returned ids by
`base.make_completion`, so both backends cut stop strings and keep eos the same way.

Needs vLLM's V1 engine (>= 0.10.2) for `logprobs_mode="raw_logprobs"`. With it, the sampled
tokens' log-probs come from the raw model, before temperature, top-p and any grammar mask, as
in HFPolicy. Tool-call grammars (constrain="tools") go through vLLM's structured outputs
(`StructuredOutputsParams(grammar=...)`, vLLM >= 0.11), built by the same policy/grammar.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from .base import (
    Answer,
    Completion,
    Request,
    Sampling,
    call_rows,
    encode_prompt,
    make_completion,
    serve_in_lockstep,
)
from .grammar import CallGrammar, prompt_grammars
from .models import resolve_model

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # values vLLM accepts for max_lora_rank


def max_lora_rank(adapter: str) -> int:
    """The smallest max_lora_rank vLLM accepts that serves this adapter's rank."""
    rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"]
    if rank > LORA_RANKS[-1]:
        raise ValueError(f"adapter {adapter} has LoRA rank {rank}; vLLM serves rank at most "
                         f"{LORA_RANKS[-1]}")
    return next(r for r in LORA_RANKS if r >= rank)


class VLLMPolicy:
    def __init__(self, model_id: str, device: str = "auto", dtype: str = "auto",
                 max_batch: int = 32, adapter: str | None = None, seed: int = 0,
                 constrain: str = "none", gpu_memory_utilization: float = 0.9):
        """gpu_memory_utilization: the GPU share vLLM takes; below its 0.9 where the same GPU
        also trains (the grpo stage)."""
        try:
            import vllm
            from vllm.lora.request import LoRARequest
        except ImportError as e:
            raise ImportError(
                "backend 'vllm' needs vLLM and a CUDA GPU: pip install 'offline-agent[vllm]' "
                "(on CPU use backend 'hf')"
            ) from e
        if device not in ("auto", "cuda") or not torch.cuda.is_available():
            raise RuntimeError(f"backend 'vllm' runs on a CUDA GPU only (device={device!r}, "
                               f"cuda available: {torch.cuda.is_available()}); use backend 'hf'")
        self._vllm, self._lora_request = vllm, LoRARequest
        path = resolve_model(model_id)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        lora, self._lora, self._lora_id = {}, None, 1
        if adapter:
            lora = {"enable_lora": True, "max_lora_rank": max_lora_rank(adapter)}
            self._lora = LoRARequest("adapter", 1, str(Path(adapter).resolve()))
        self.llm = vllm.LLM(
            model=path,
            dtype="bfloat16" if dtype == "auto" else dtype,
            seed=seed,
            enable_prefix_caching=True,
            max_num_seqs=max_batch,
            logprobs_mode="raw_logprobs",
            gpu_memory_utilization=gpu_memory_utilization,
            **lora,
        )
        self._rng = torch.Generator().manual_seed(seed)  # seeds calls whose Sampling.seed is None
        self.constrain = constrain

    def use_adapter(self, folder: str) -> None:
        """Serve the adapter in `folder` from the next call on (the policy must have been built
        with an adapter, so LoRA is enabled at its rank). It gets a new LoRA id: vLLM keeps
        adapters by id, so an updated adapter under an old id would be served stale."""
        if self._lora is None:
            raise RuntimeError("use_adapter needs a VLLMPolicy built with an adapter")
        self._lora_id += 1
        self._lora = self._lora_request(f"adapter-{self._lora_id}", self._lora_id,
                                        str(Path(folder).resolve()))

    def sample(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[Completion]]:
        """n completions per prompt. Completion.logprobs are under the raw model (temperature 1,
        no top-p), whatever the sampling settings."""
        rows, seeds, temperatures = call_rows(self.tokenizer, prompts, n, sampling, self._rng)
        grammars = [None] * len(prompts)
        if self.constrain == "tools":
            grammars = prompt_grammars(sampling, len(prompts))
        grammars = [g for g in grammars for _ in range(n)]
        params = [self._params(sampling, temperatures[r], seeds[r], grammars[r])
                  for r in range(len(rows))]
        outputs = self.llm.generate(
            [self._vllm.TokensPrompt(prompt_token_ids=row) for row in rows],
            params, use_tqdm=False, lora_request=self._lora,
        )
        out = []
        for o in (request.outputs[0] for request in outputs):
            logprobs = [step[t].logprob for t, step in zip(o.token_ids, o.logprobs)]
            # finish_reason "stop" with no stop string means eos (or a stop token id) ended it
            ended = o.finish_reason == "stop" and not isinstance(o.stop_reason, str)
            constrained = grammars[len(out)] is not None
            stop = grammars[len(out)].stop if constrained else sampling.stop
            out.append(make_completion(self.tokenizer, list(o.token_ids), logprobs,
                                       list(stop), ended))
            out[-1].constrained = constrained
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]

    def serve(self, requests: list[Request], sampling: Sampling, answer: Answer) -> None:
        """Policy.serve in lockstep: vLLM batches each call's requests continuously itself."""
        serve_in_lockstep(self, requests, sampling, answer)

    def _params(self, sampling: Sampling, temperature: float, seed: int,
                grammar: CallGrammar | None):
        """One row's SamplingParams. A row with a grammar decodes under vLLM's structured
        outputs and ends with its call, or at a stop string the grammar allows after it, as in
        HFPolicy. vLLM has no hook for the hf backend's closing steers (policy/constrained.py),
        so a call still open at max_tokens is cut there and comes back invalid."""
        structured = None
        if grammar is not None:
            from vllm.sampling_params import StructuredOutputsParams

            structured = StructuredOutputsParams(grammar=grammar.text)
        return self._vllm.SamplingParams(
            temperature=temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(grammar.stop if grammar is not None else sampling.stop) or None,
            seed=seed,
            logprobs=0,  # only the sampled token's log-prob
            skip_special_tokens=False,  # stop strings see the text HFPolicy sees
            structured_outputs=structured,
        )

    def score(self, prompt: str, continuations: list[str]) -> list[float]:
        """Summed log-prob of each continuation after the prompt (see choice_logprobs)."""
        return self.choice_logprobs([prompt], [continuations])[0]

    def choice_logprobs(self, prompts: list[str], choices: list[list[str]]) -> list[list[float]]:
        """For each prompt, the summed log-prob of each of its choices, read from vLLM's prompt
        log-probs of prompt + choice. Prompt and choice are tokenized apart and their ids
        concatenated, as in generation. (vLLM recomputes, rather than reads, the prefix cache
        for requests that ask for prompt log-probs.)"""
        ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        pairs = [(i, self.tokenizer(c, add_special_tokens=False).input_ids)
                 for i, cs in enumerate(choices) for c in cs]
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0,
                                           detokenize=False)
        outputs = self.llm.generate(
            [self._vllm.TokensPrompt(prompt_token_ids=ids[i] + c) for i, c in pairs],
            params, use_tqdm=False, lora_request=self._lora,
        )
        flat = [
            sum(o.prompt_logprobs[t][o.prompt_token_ids[t]].logprob
                for t in range(len(ids[i]), len(o.prompt_token_ids)))
            for (i, _), o in zip(pairs, outputs)
        ]
        out, at = [], 0
        for cs in choices:
            out.append(flat[at:at + len(cs)])
            at += len(cs)
        return out

"""The hf backend's grammar machinery: xgrammar compiles a grammar once per distinct text and
gives each row its own matcher; each decode step fills the batch's token bitmask and applies
it to the logits before sampling or argmax.

xgrammar runs on CPU without its `triton` requirement (only its GPU kernels use triton), so
the Makefile installs it with --no-deps and its pure dependencies beside it.
"""

from __future__ import annotations

import torch

from .grammar import CLOSERS, CallGrammar

INSTALL = ("constrain='tools' needs xgrammar: pip install --no-deps xgrammar==0.2.8 "
           "'apache-tvm-ffi>=0.1.11' pydantic (make install does this)")


def import_xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise ImportError(INSTALL) from e
    return xgrammar


class GrammarMasks:
    """Compiled grammars (cached by their text) and the per-step masking of a batch."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.xgr = import_xgrammar()
        info = self.xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                        stop_token_ids=stop_token_ids)
        self.compiler = self.xgr.GrammarCompiler(info)  # caches compiled grammars by text
        self.vocab_size = vocab_size
        pieces = info.decoded_vocab  # bytes of each token
        self.single = torch.tensor([len(p) == 1 for p in pieces]
                                   + [False] * (vocab_size - len(pieces)))
        self.single[stop_token_ids] = True
        ids = {p: i for i, p in enumerate(pieces) if len(p) == 1}
        # end-of-turn first: once the call is complete, nothing else
        self.closers = [*stop_token_ids, *(ids[c.encode()] for c in CLOSERS if c.encode() in ids)]

    def matchers(self, grammars: list[CallGrammar | None]) -> list:
        """A fresh matcher per row (None where the row is free text)."""
        return [None if g is None else
                self.xgr.GrammarMatcher(self.compiler.compile_grammar(g.text)) for g in grammars]

    def mask(self, logits: torch.Tensor, matchers: list, closing: list[bool]) -> torch.Tensor:
        """A copy of `logits` with every token the row's matcher forbids at -inf (rows without
        a matcher unchanged). A closing row (as many tokens left as its grammar's horizon)
        keeps only one-character tokens, and only the first allowed of end-of-turn, `]`, `"`,
        `}`, `,` where one is allowed: that path finishes any call within the horizon."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        bitmask = self.xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for i in rows:
            matchers[i].fill_next_token_bitmask(bitmask, i)
        out = logits.clone()
        self.xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=rows)
        for i in (i for i in rows if closing[i]):
            row = out[i]
            row[~self.single.to(row.device)] = float("-inf")
            closer = next((t for t in self.closers if row[t] > float("-inf")), None)
            if closer is not None:
                keep = row[closer].clone()
                row.fill_(float("-inf"))
                row[closer] = keep
        return out
    @staticmethod
    def advance(matcher, token: int) -> bool:
        """Feed the row's new token; True once the call and its end-of-turn are complete."""
        if not matcher.accept_token(token):
            raise RuntimeError(f"token {token} was drawn against the grammar's mask")
        return matcher.is_terminated()

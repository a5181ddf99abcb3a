"""The hf backend's grammar machinery: xgrammar compiles a grammar once per distinct text and
gives each row its own matcher; each decode step fills the batch's token bitmask and applies
it to the logits before sampling or argmax.

xgrammar runs on CPU without its `triton` requirement (only its GPU kernels use triton), so
the Makefile installs it with --no-deps and its pure dependencies beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class RowState:
    """One constrained row: its grammar, its matcher, the characters it has written."""

    grammar: CallGrammar
    matcher: object
    chars: int = 0


class GrammarMasks:
    """Compiled grammars (cached by their text) and the per-step masking of a batch."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.xgr = import_xgrammar()
        info = self.xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                        stop_token_ids=stop_token_ids)
        self.compiler = self.xgr.GrammarCompiler(info)  # caches compiled grammars by text
        self.vocab_size = vocab_size
        pieces = info.decoded_vocab  # bytes of each token
        self.lengths = [len(p) for p in pieces] + [0] * (vocab_size - len(pieces))
        self.longest = max(self.lengths)
        self.single = torch.tensor([n == 1 for n in self.lengths])
        self.single[stop_token_ids] = True
        ids = {p: i for i, p in enumerate(pieces) if len(p) == 1}
        # end-of-turn first: once the call is complete, nothing else
        self.closers = [*stop_token_ids, *(ids[c.encode()] for c in CLOSERS if c.encode() in ids)]

    def rows(self, grammars: list[CallGrammar | None]) -> list[RowState | None]:
        """A fresh matcher per row (None where the row is free text)."""
        return [None if g is None else
                RowState(g, self.xgr.GrammarMatcher(self.compiler.compile_grammar(g.text)))
                for g in grammars]

    def mask(self, logits: torch.Tensor, rows: list[RowState | None], left: int) -> torch.Tensor:
        """A copy of `logits` with every token the row's matcher forbids at -inf (rows without
        a matcher unchanged). A closing row (`left` tokens are its grammar's horizon, or the
        next token could take its text past `max_chars` less the horizon) keeps only
        one-character tokens, and only the first allowed of end-of-turn, `]`, `"`, `}`, `,`
        where one is allowed: that path finishes any call within the horizon."""
        constrained = [i for i, row in enumerate(rows) if row is not None]
        bitmask = self.xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for i in constrained:
            rows[i].matcher.fill_next_token_bitmask(bitmask, i)
        out = logits.clone()
        self.xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=constrained)
        for i in constrained:
            g = rows[i].grammar
            if left <= g.horizon or rows[i].chars + self.longest + g.horizon > g.max_chars:
                self._close(out[i])
        return out

    def _close(self, row: torch.Tensor) -> None:
        row[~self.single.to(row.device)] = float("-inf")
        closer = next((t for t in self.closers if row[t] > float("-inf")), None)
        if closer is not None:
            keep = row[closer].clone()
            row.fill_(float("-inf"))
            row[closer] = keep

    def advance(self, row: RowState, token: int) -> bool:
        """Feed the row's new token; True once the call and its end-of-turn are complete."""
        if not row.matcher.accept_token(token):
            raise RuntimeError(f"token {token} was drawn against the grammar's mask")
        row.chars += self.lengths[token]
        return row.matcher.is_terminated()

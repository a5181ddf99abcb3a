"""The hf backend's grammar machinery: xgrammar compiles a grammar once per distinct text and
gives each row its own matcher; each decode step fills the batch's token bitmask and applies
it to the logits before sampling or argmax.

xgrammar runs on CPU without its `triton` requirement (only its GPU kernels use triton), so
the Makefile installs it with --no-deps and its pure dependencies beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .grammar import CLOSERS, CallGrammar

HEAD_BYTES = 256  # longer than any call's head (tool names are identifiers)
QUOTE, COMMA, SEPARATORS = ord('"'), ord(","), (ord("="), ord(":"))
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
    """One constrained row: its grammar, its matcher, the characters it has written, whether
    it is closing its call, and this step's redirect (the turn-ending tokens the grammar
    forbids, and the token that closes the call instead; None where the row may not end)."""

    grammar: CallGrammar
    matcher: object
    chars: int = 0
    closing: bool = False
    redirect: tuple[torch.Tensor, int] | None = None
    tail: bytes = b""  # the text's last bytes, where a stop string may have begun
    head: bytes = b""  # the text's first bytes: which keyed call it began (grammar.Closing)
    in_string: bool = False  # inside a quoted value (they hold no quote)
    commas: int = 0  # commas written outside quoted values
    seps: int = 0  # key separators (`=` or `:`) written outside quoted values

    def horizon(self) -> int:
        """Tokens that finish the call from here: its own call's bound once that call's head
        is written (grammar.Closing), else the grammar's bound for any call."""
        for closing in self.grammar.closings:
            if self.head.startswith(closing.head.encode()):
                return closing.need(self.commas, self.seps)
        return self.grammar.horizon


@dataclass
class TokenMask:
    """What the decoder let one sampled token be drawn from, as numpy.packbits bits over the
    vocabulary: `allowed`, the tokens with finite logits after `mask`; `merged`, where the
    token is the end `settle` redirects forbidden turn-ending tokens to, those tokens (a draw
    of any of them came out as this token), else None."""

    allowed: np.ndarray
    merged: np.ndarray | None = None

    def unpack(self, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(allowed, merged) as (vocab_size,) bool tensors (merged all False when None)."""
        def bits(x):
            return torch.from_numpy(np.unpackbits(x, count=vocab_size).astype(bool))
        merged = torch.zeros(vocab_size, dtype=torch.bool) if self.merged is None else bits(self.merged)
        return bits(self.allowed), merged


def _packed(mask: torch.Tensor) -> np.ndarray:
    return np.packbits(mask.cpu().numpy())


class GrammarMasks:
    """Compiled grammars (cached by their text) and the per-step masking of a batch."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.xgr = import_xgrammar()
        info = self.xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                        stop_token_ids=stop_token_ids)
        self.compiler = self.xgr.GrammarCompiler(info)  # caches compiled grammars by text
        self.vocab_size = vocab_size
        pieces = self.pieces = info.decoded_vocab  # bytes of each token
        self.stop_ids = stop_token_ids
        self.ends: dict[tuple, torch.Tensor] = {}  # see `_ends`
        self.lengths = [len(p) for p in pieces] + [0] * (vocab_size - len(pieces))
        self.longest = max(self.lengths)
        self.single = torch.tensor([n == 1 for n in self.lengths])
        self.single[stop_token_ids] = True
        ids = {p: i for i, p in enumerate(pieces) if len(p) == 1}
        # end-of-turn first: once the call is complete, nothing else
        self.closers = [*stop_token_ids, *(ids[c.encode()] for c in CLOSERS if c.encode() in ids)]
        # end-of-turn (the call is complete) and `]` (bracket text may end here; JSON strings
        # and literals never allow a `]`, so it is never text the grammar requires)
        self.enders = self.closers[:len(stop_token_ids) + 1]

    def rows(self, grammars: list[CallGrammar | None]) -> list[RowState | None]:
        """A fresh matcher per row (None where the row is free text)."""
        return [None if g is None else
                RowState(g, self.xgr.GrammarMatcher(self.compiler.compile_grammar(g.text)))
                for g in grammars]

    def mask(self, logits: torch.Tensor, rows: list[RowState | None], left: list[int]
             ) -> torch.Tensor:
        """A copy of `logits` with every token the row's matcher forbids at -inf (rows without
        a matcher unchanged), except, where the grammar allows end-of-turn or `]` next, the
        tokens that end a turn (end-of-turn, a stop string of the grammar): the model may still
        want to stop there, and `settle` reads that as closing the call, as the Python env
        reads a free reply that stops inside a call (`PythonTasks.close_call`).
        A closing row (it drew such a token, or its `left[i]` tokens to go are its
        `horizon()`, or the next token could take its text past `max_chars` less the horizon)
        keeps only one-character tokens, and only the first allowed of end-of-turn, `]`, `"`,
        `}`, `,` where one is allowed: that path finishes any call within the horizon."""
        constrained = [i for i, row in enumerate(rows) if row is not None]
        bitmask = self.xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for i in constrained:
            rows[i].matcher.fill_next_token_bitmask(bitmask, i)
        out = logits.clone()
        self.xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=constrained)
        for i in constrained:
            row, g = rows[i], rows[i].grammar
            row.closing |= left[i] <= row.horizon() or row.chars + self.longest + g.horizon > g.max_chars
            ender = None if row.closing else next(
                (t for t in self.enders if out[i, t] > float("-inf")), None)
            row.redirect = None
            if row.closing:
                self._close(out[i])
            elif ender is not None:
                forbidden = self._ends(g.stop, row.tail).to(out.device) & (out[i] == float("-inf"))
                out[i][forbidden] = logits[i][forbidden]
                row.redirect = (forbidden, ender)
        return out

    def settle(self, tokens: torch.Tensor, rows: list[RowState | None]) -> torch.Tensor:
        """`tokens` drawn from `mask`'s logits, with each turn-ending token the grammar forbids
        replaced by end-of-turn or else `]`, whichever it allows; the row then closes its call.
        (`mask` lets a row end only where one of them is allowed: bracket text can close.)"""
        for i, row in enumerate(rows):
            if row is not None and row.redirect is not None and row.redirect[0][tokens[i]]:
                row.closing = True
                tokens[i] = row.redirect[1]
        return tokens

    def _ends(self, stop: tuple[str, ...], tail: bytes) -> torch.Tensor:
        """The tokens that end a free reply here: end-of-turn, and tokens that begin a stop
        string or finish one the text's tail began (`\n` after `\n` where `\n\n` stops;
        not `x\n\n`, whose text goes on first). Cached by what the tail has begun."""
        texts = [s.encode() for s in stop]
        begun = tuple(tail[j:] for j in range(len(tail) + 1)
                      if any(t.startswith(tail[j:]) and j > len(tail) - len(t) for t in texts))
        if (stop, begun) not in self.ends:
            ends = torch.zeros(self.vocab_size, dtype=torch.bool)
            ends[self.stop_ids] = True
            ends[[i for i, p in enumerate(self.pieces)
                  if any((b + p).startswith(t) for b in begun for t in texts)]] = True
            self.ends[stop, begun] = ends
        return self.ends[stop, begun]

    def _close(self, row: torch.Tensor) -> None:
        row[~self.single.to(row.device)] = float("-inf")
        closer = next((t for t in self.closers if row[t] > float("-inf")), None)
        if closer is not None:
            keep = row[closer].clone()
            row.fill_(float("-inf"))
            row[closer] = keep

    def advance(self, row: RowState, token: int) -> bool:
        """Feed the row's new token; True once the call and its end (end-of-turn, or a stop
        string: free text never holds one, so the text ending in one is past the call)."""
        if not row.matcher.accept_token(token):
            raise RuntimeError(f"token {token} was drawn against the grammar's mask")
        row.chars += self.lengths[token]
        if token < len(self.pieces):
            piece = self.pieces[token]
            row.tail = (row.tail + piece)[-8:]
            row.head = (row.head + piece)[:HEAD_BYTES]
            for byte in piece:
                if byte == QUOTE:
                    row.in_string = not row.in_string
                elif not row.in_string:
                    row.commas += byte == COMMA
                    row.seps += byte in SEPARATORS
        return row.matcher.is_terminated() or row.tail.endswith(
            tuple(s.encode() for s in row.grammar.stop))

    def replay(self, grammar: CallGrammar, ids: list[int], max_new_tokens: int) -> list[TokenMask]:
        """The mask each of `ids` (one reply the hf decoder drew under `grammar` with that
        budget) was drawn under, rebuilt by running `mask`, `settle` and `advance` over them as
        HFPolicy's decode step does: what GRPO's ratio renormalises over. Masks do not depend
        on the logits, only on the tokens so far, except where the end `settle` redirects to
        was written: drawn itself or redirected (then the row closes), which the tokens after
        it may not tell apart. Redirected (the redirected tokens' mass counts, then the row
        closes) is taken where the next tokens allow it, drawn where they do not
        (docs/training.md names the residual)."""
        drawn: set[int] = set()
        while True:
            masks, failed, assumed = self._replay(grammar, ids, max_new_tokens, drawn)
            if failed is None:
                return masks
            earlier = [a for a in assumed if a < failed]
            if not earlier:
                raise RuntimeError(f"token {ids[failed]} at position {failed} is outside the "
                                   "grammar's mask: not a reply drawn under this grammar")
            drawn.add(earlier[-1])

    def _replay(self, grammar: CallGrammar, ids: list[int], budget: int, drawn: set[int]):
        """(masks, None, _) or (None, the first position whose token the mask forbids, the
        positions taken as redirected); `drawn`: positions taken as drawn instead."""
        row = self.rows([grammar])[0]
        zeros = torch.zeros(1, self.vocab_size)
        masks, assumed = [], []
        for t, token in enumerate(ids):
            allowed = self.mask(zeros, [row], [budget - t])[0] > float("-inf")
            if not allowed[token]:
                return None, t, assumed
            merged = None
            if row.redirect is not None and token == row.redirect[1] and t not in drawn:
                merged = _packed(row.redirect[0])  # as settle does when it redirects a draw
                row.closing = True
                assumed.append(t)
            masks.append(TokenMask(_packed(allowed), merged))
            self.advance(row, token)
        return masks, None, assumed

"""Key/value states of prompt prefixes seen before, so a prompt that extends one already
computed only computes its new tokens.

Search and batched episodes send the model prompts that grow by one step at a time: the next
step of an episode is the previous prompt plus an action and an observation, the K proposals
of a node share their whole prompt, every prompt shares the system prompt. On a CPU, prefilling
those histories again costs more than decoding the short actions. This is vLLM's automatic
prefix caching for the hf backend: prompts are cut into blocks of `block_size` tokens, a block
is identified by its parent block and its own tokens (so a lookup is exact, never a hash
collision), and the least recently used blocks are dropped when the memory budget is full.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class PrefixCache:
    def __init__(self, block_size: int = 32, max_bytes: int = 2 * 2**30):
        self.block_size, self.max_bytes = block_size, max_bytes
        self.bytes = 0
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent, tokens) -> block id
        # block id -> (keys, values, its key in _ids); keys/values: [layers, kv heads, block, dim]
        self._blocks: OrderedDict[int, tuple[torch.Tensor, torch.Tensor, tuple]] = OrderedDict()
        self._next = 1  # block ids start at 1; 0 is the parent of a first block

    def __len__(self) -> int:
        return len(self._blocks)

    def fork(self) -> PrefixCache:
        """A cache in this one's state that changes apart from it (the kept tensors are shared:
        blocks are never written after they are stored). Lets a benchmark run two code paths
        from the same state."""
        other = PrefixCache(self.block_size, self.max_bytes)
        other.bytes, other._next = self.bytes, self._next
        other._ids, other._blocks = dict(self._ids), OrderedDict(self._blocks)
        return other

    def match(self, ids: list[int]) -> list[int]:
        """Block ids of the longest cached prefix of `ids` (whole blocks only), marked as used."""
        parent, found, size = 0, [], self.block_size
        for start in range(0, len(ids) - size + 1, size):
            block = self._ids.get((parent, tuple(ids[start:start + size])))
            if block is None:
                break
            self._blocks.move_to_end(block)
            found.append(block)
            parent = block
        return found

    def gather(self, blocks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `blocks` in order: [layers, kv heads, tokens, dim] each."""
        keys = torch.cat([self._blocks[b][0] for b in blocks], dim=2)
        values = torch.cat([self._blocks[b][1] for b in blocks], dim=2)
        return keys, values

    def store(self, ids: list[int], keys: torch.Tensor, values: torch.Tensor,
              start: int = 0) -> None:
        """Keep the whole blocks of `ids`. keys/values ([layers, kv heads, len(ids) - start, dim])
        were just computed for ids[start:]; `start` is a multiple of block_size whose blocks are
        kept already, so a caller copies only the new part. Kept blocks are left as they are."""
        parent, size = 0, self.block_size
        for begin in range(0, len(ids) - size + 1, size):
            key = (parent, tuple(ids[begin:begin + size]))
            block = self._ids.get(key)
            if block is None:
                if begin < start:  # dropped since it was matched: nothing after it is reachable
                    break
                block, self._next = self._next, self._next + 1
                k = keys[:, :, begin - start:begin - start + size].clone()
                v = values[:, :, begin - start:begin - start + size].clone()
                self._ids[key] = block
                self._blocks[block] = (k, v, key)
                self.bytes += k.nbytes + v.nbytes
            else:
                self._blocks.move_to_end(block)
            parent = block
        while self.bytes > self.max_bytes and self._blocks:
            _, (k, v, key) = self._blocks.popitem(last=False)
            del self._ids[key]  # its descendants can no longer be reached; they age out too
            self.bytes -= k.nbytes + v.nbytes

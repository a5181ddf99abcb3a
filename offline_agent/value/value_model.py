"""The value model V(state, action): a linear head on the base model's hidden state at the
last token of the action (the end-of-turn token the policy emits to stop), read after the
first critic.layer_share of its decoder layers with the final norm applied, optionally with
LoRA on the base (critic.lora_r; 0: the base stays frozen, only the head learns). The layers
above are cut off: never run, never kept. On MiniShop a middle layer ranked item pages of a
task by their buy reward better than the last (docs/architecture.md, "The learned critic").

A state is read one of two ways (critic.state, `state_prompt`): as the policy saw it (the
node's conversation: system prompt, demonstration, goal, every step so far), or as the goal and
the env's latest observation alone (`page`: where an observation describes the whole state, as
MiniShop's pages do, two paths to the same page are one state, whatever the steps before). Its
candidate actions follow as one assistant turn each, and all are packed as a prefix trie
(training/logprobs.py): the shared prompt is one branch computed once, each action one
branch off it. One forward of the decoder (the LM head is never run) over the flattened trie
gives every action's value: no forward per action, and no second forward for the head,
which reads the hidden states that forward computes. Several states go in one trie; the
system prompt and demonstration they share are computed once too.

Saved as a folder: value_head.safetensors, critic.json (the base, lora_r, state and the
decoder layers kept) and with LoRA the PEFT adapter files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from offline_agent.chat import encode_prompt_completion, history_messages
from offline_agent.policy.adapters import import_peft, quiet_peft
from offline_agent.training import trie_attention
from offline_agent.training.logprobs import Encoded, Trie, ancestors, groups
from offline_agent.types import Message, Step
from offline_agent.value.config import STATES, CriticConfig

HEAD, META = "value_head.safetensors", "critic.json"


def state_prompt(state: str, system: str, demo: list[Message], instruction: str,
                 first_observation: str, steps: list[Step]) -> list[Message]:
    """The messages a state is valued from: the policy's conversation (`conversation`), or the
    same system prompt, demonstration and goal with the latest observation alone (`page`)."""
    if state == "conversation":
        return history_messages(system, instruction, first_observation, steps, demo)
    if state == "page":
        page = steps[-1].observation if steps else first_observation
        return history_messages(system, instruction, page, [], demo)
    raise ValueError(f"critic state must be one of {STATES}, got {state!r}")


def encode_actions(tokenizer, prompt: list[Message], actions: list[str]) -> list[list[int]]:
    """Ids of prompt + each action as the next assistant turn, each ending at the action's
    end-of-turn token (the value is read there). An action is encoded from its text: the
    search's Critique carries texts, and training encodes the same way."""
    out = []
    for action in actions:
        ids, mask = encode_prompt_completion(tokenizer, prompt, [Message("assistant", action)])
        last = max(i for i, m in enumerate(mask) if m)
        out.append(ids[: last + 1])
    return out


@dataclass
class ValuePacked:
    """Sequences as one flattened trie: a value is read at each sequence's last node."""

    ids: torch.Tensor        # (1, L)
    positions: torch.Tensor  # (1, L)
    allowed: torch.Tensor    # (L, L) bool
    rows: torch.Tensor       # (num_seqs,) the node of each sequence's last token


def pack_values(seqs: list[list[int]]) -> ValuePacked:
    trie, rows = Trie(), []
    for ids in seqs:
        rows.append(trie.add(ids)[-1])
    return ValuePacked(torch.tensor([trie.token]), torch.tensor([trie.depth]), ancestors(trie),
                       torch.tensor(rows))


def trie_size(seqs: list[list[int]]) -> int:
    """Tokens of the trie of `seqs` (what one forward of them costs)."""
    trie = Trie()
    for ids in seqs:
        trie.add(ids)
    return len(trie)


class ValueModel(torch.nn.Module):
    """`lm` (a causal LM, LoRA-wrapped or not) and the head Linear(hidden, 1), in float32."""

    def __init__(self, lm, head: torch.nn.Linear):
        super().__init__()
        self.lm, self.head = lm, head
        trie_attention.use(lm)

    def decoder(self):
        """The transformer without its LM head (LoRA layers, if any, sit inside it)."""
        peft = import_peft()
        base = self.lm.get_base_model() if isinstance(self.lm, peft.PeftModel) else self.lm
        return base.get_decoder()

    def features(self, packed: ValuePacked) -> torch.Tensor:
        """The kept decoder's output (final norm applied) at each sequence's last token, float32."""
        device = self.head.weight.device
        dtype = next(p for p in self.lm.parameters() if p.is_floating_point()).dtype
        hidden = self.decoder()(
            input_ids=packed.ids.to(device), position_ids=packed.positions.to(device),
            use_cache=False, trie_plan=trie_attention.plan(packed.allowed, dtype, device),
        ).last_hidden_state[0]
        return hidden[packed.rows.to(device)].float()

    def forward(self, packed: ValuePacked) -> torch.Tensor:
        return self.head(self.features(packed)).squeeze(-1)


def values_of(model: ValueModel, states: list[list[list[int]]], budget: int) -> list[list[float]]:
    """V of each state's action sequences (encode_actions), in tries of at most `budget`
    tokens, one forward each (no grad): what scoring in search and prediction in the fit run."""
    out: list[list[float]] = [[] for _ in states]
    with torch.no_grad():
        for group in groups([[Encoded(ids, []) for ids in s] for s in states], budget):
            values = iter(model(pack_values([ids for i in group for ids in states[i]])).tolist())
            for i in group:
                out[i] = [next(values) for _ in states[i]]
    return out


def keep_layers(lm, layers: int | None) -> None:
    """Cut `lm`'s decoder to its first `layers` layers (None: all kept), in place."""
    if layers is not None:
        decoder = lm.get_decoder()
        decoder.layers = decoder.layers[:layers]


def build(lm, cfg: CriticConfig) -> ValueModel:
    """A fresh value model on `lm`: its decoder cut to round(cfg.layer_share * depth) layers
    (at least one), the base frozen, LoRA of rank cfg.lora_r (0: none) and the head seeded."""
    keep_layers(lm, max(1, round(cfg.layer_share * len(lm.get_decoder().layers))))
    for p in lm.parameters():
        p.requires_grad_(False)
    if cfg.lora_r:
        peft = import_peft()
        torch.manual_seed(cfg.seed)
        lora = peft.LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=0.0,
                               target_modules=list(cfg.target_modules))
        with quiet_peft():
            lm = peft.get_peft_model(lm, lora)
    torch.manual_seed(cfg.seed)
    head = torch.nn.Linear(lm.config.hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    return ValueModel(lm, head.to(next(lm.parameters()).device))


def save(model: ValueModel, folder: Path, base: str, cfg: CriticConfig) -> None:
    """Write the head, the metadata and (with LoRA) the adapter into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
              folder / HEAD)
    meta = {"base": base, "lora_r": cfg.lora_r, "state": cfg.state,
            "layers": len(model.decoder().layers)}
    (folder / META).write_text(json.dumps(meta))
    if cfg.lora_r:
        model.lm.save_pretrained(folder)


def resolve_device(device: str) -> str:
    """auto: cuda when available, else cpu (as model.device reads it)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_lm(model_id: str, device: str):
    """The causal LM of `model_id` in float32: what a value model sits on."""
    from transformers import AutoModelForCausalLM

    from offline_agent.policy.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(model_id),
                                                dtype=torch.float32).to(device)


def load_tokenizer(model_id: str):
    from transformers import AutoTokenizer

    from offline_agent.policy.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model_id))


def base_of(folder: str | Path) -> str:
    """The model id the value model in `folder` sits on."""
    return json.loads((Path(folder) / META).read_text())["base"]


def state_of(folder: str | Path) -> str:
    """How the value model in `folder` reads a state (`state_prompt`); folders saved before
    critic.state existed read the conversation."""
    return json.loads((Path(folder) / META).read_text()).get("state", "conversation")


def load(folder: str | Path, device: str = "cpu") -> ValueModel:
    """A saved value model, on its base (loaded in float32, cut to the layers it was fitted
    with; all for folders saved before critic.layer_share), for scoring (eval mode, no grad)."""
    folder = Path(folder)
    meta = json.loads((folder / META).read_text())
    lm = load_lm(meta["base"], device)
    keep_layers(lm, meta.get("layers"))
    if meta["lora_r"]:
        with quiet_peft():
            lm = import_peft().PeftModel.from_pretrained(lm, str(folder)).merge_and_unload()
    state = load_file(folder / HEAD)
    head = torch.nn.Linear(state["weight"].shape[1], 1)
    head.load_state_dict(state)
    model = ValueModel(lm, head.to(device)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model

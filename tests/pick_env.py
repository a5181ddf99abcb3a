"""Two tiny deterministic envs GRPO must learn, and a tiny random model that can act in them.

`Pick`: the instruction names one of four tools ("Call blue."); calling it earns 1, any other
0; one step. `PickTwice`: two steps, and only the second decides: the first call, whatever
it is, leads to the same state ("now choose"), so with grpo.step_groups every second step of
a task's group shares one state. `biased_tiny_model` puts nearly all of its output mass on
the four tool names (a constant hidden feature read by an untied head), so a random policy
calls a tool every time and succeeds at chance (1/4): what GRPO starts from.
"""

from __future__ import annotations

from offline_agent.envs.base import Env, StepResult
from offline_agent.types import Task, ToolCall

NAMES = ["red", "green", "blue", "gold"]  # one token each in SmolLM2's tokenizer
TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool",
                                           "parameters": {"type": "object", "properties": {}}}}
         for n in NAMES]


class Pick(Env):
    name = "pick"
    tools = TOOLS
    stop = ["\n"]
    max_action_tokens = 1  # one token: the name of the tool it calls
    steps = 1  # the step whose call decides

    def __init__(self, max_steps: int = 2, seed: int = 0):
        super().__init__(max_steps=max(max_steps, self.steps), seed=seed)

    def tasks(self, split: str, n: int) -> list[Task]:
        offset = 0 if split == "train" else 1
        return [Task(id=f"{split}-{i}", env=self.name, split=split,
                     instruction=f"Call {NAMES[(i + offset) % len(NAMES)]}.",
                     data={"target": NAMES[(i + offset) % len(NAMES)]}) for i in range(n)]

    def system_prompt(self) -> str:
        return "Call the tool the user names."

    def _reset(self, task: Task) -> str:
        self.state = {"step": 0}
        return ""

    def _execute(self, call: ToolCall) -> StepResult:
        self.state = {"step": self.state["step"] + 1}
        if self.state["step"] < self.steps:
            return StepResult("Now choose.")
        won = call.name == self.task.data["target"]
        return StepResult("right" if won else "wrong", reward=float(won), done=True)


class PickTwice(Pick):
    name = "pick-twice"
    steps = 2


class PickLong(Pick):
    """Pick with room for a grammar (model.constrain: tools): a constrained call is written
    one character a token where it must be, so it needs its name's length in tokens."""

    name = "pick-long"
    max_action_tokens = 8


def biased_tiny_model(tokenizer, seed: int = 0, margin: float = 12.0):
    """A 2-layer random Llama whose head scores the four tool names `margin` above every other
    token through a constant hidden feature (dimension 0 of every embedding)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
                         initializer_range=0.2)
    model = LlamaForCausalLM(config).eval()
    names = [tokenizer(n, add_special_tokens=False).input_ids[0] for n in NAMES]
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 3.0
        head = model.lm_head.weight
        head[:, 0] = -margin / 2
        head[names, 0] = margin / 2
    return model

"""Fakes shared by several test files: toy envs with known answers and the config that runs
the pipeline on one. Unit tests of pure logic use them; tests of real parts do not."""

from __future__ import annotations

from offline_agent.envs.base import ActionError, Env, StepResult
from offline_agent.envs.minishop import MiniShop
from offline_agent.types import Task, ToolCall
from pipelines.config import RunConfig

FAKE_ENV = "tests.fakes:FakeEnv"


class FakeEnv(Env):
    """Tasks `<prefix>-<split>-<seed>-<i>`; one tool that ends the episode with reward 1."""

    name = "fake"
    tools = [{"type": "function", "function": {"name": "finish", "parameters": {}}}]  # noqa: RUF012
    max_action_tokens = 16  # the tiny random model writes noise: a third of the default costs less

    def __init__(self, max_steps: int = 3, seed: int = 0, prefix: str = "t"):
        super().__init__(max_steps=max_steps, seed=seed)
        self.prefix = prefix

    def tasks(self, split: str, n: int) -> list[Task]:
        return [Task(f"{self.prefix}-{split}-{self.seed}-{i}", self.name, f"task {i}", split,
                     {"i": i}) for i in range(n)]

    def system_prompt(self) -> str:
        return "Call finish."

    def _reset(self, task: Task) -> str:
        self.state = {"done": False}
        return "start"

    def _execute(self, call: ToolCall) -> StepResult:
        return StepResult("finished", reward=1.0, done=True)


def fake_cfg(*overrides: str) -> RunConfig:
    """A run of FakeEnv with 3 train and 2 test tasks (the model is never loaded by the
    stages these configs are used with)."""
    return RunConfig.load(None, [f"env.name={FAKE_ENV}", "env.train_tasks=3",
                                 "env.test_tasks=2", *overrides])


class ShortMiniShop(MiniShop):
    """MiniShop with a third of its reply budget, for runs of the tiny random model (its
    replies are noise at any length; each token is one more forward pass of the batch)."""

    max_action_tokens = 16


class Corridor(Env):
    """Two moves, left or right. Only right-right pays 1; right-left pays 0.25; left pays 0."""

    name = "corridor"
    tools = [{"type": "function", "function": {  # noqa: RUF012
        "name": "go", "parameters": {"type": "object", "properties": {
            "direction": {"type": "string"}}, "required": ["direction"]}}}]

    def tasks(self, split, n):
        return [Task(id=f"corridor-{i}", env="corridor", instruction="reach the end") for i in range(n)]

    def system_prompt(self):
        return "go[left] or go[right]"

    def _reset(self, task):
        self.state = ""
        return "start"

    def _execute(self, call: ToolCall) -> StepResult:
        d = call.arguments["direction"]
        if d not in ("left", "right"):
            raise ActionError("direction must be left or right")
        self.state += d[0]
        if len(self.state) < 2:
            return StepResult(observation=f"at {self.state}")
        reward = {"rr": 1.0, "rl": 0.25}.get(self.state, 0.0)
        return StepResult(observation="end", reward=reward, done=True)


class ListedCorridor(Corridor):
    """Corridor that lists its moves, as a web page lists its links."""

    name = "listed-corridor"

    def available_actions(self):
        return [] if self.state in ("rr", "rl", "lr", "ll") else ["go[left]", "go[right]"]


class SubmitCorridor(Env):
    """Moves left or right as often as wanted; `submit` ends the episode, paying 1 after
    right-right, 0.25 after right-left, else 0. It names `submit` in `ending_tools`, and its
    verifier counts its calls (in `verifier_calls`, over every instance)."""

    name = "submit-corridor"
    tools = [*Corridor.tools,  # noqa: RUF012
             {"type": "function", "function": {"name": "submit", "parameters": {}}}]
    ending_tools = ("submit",)
    verifier_calls = 0

    def tasks(self, split, n):
        return [Task(id=f"submit-{split}-{i}", env=self.name, instruction=f"reach rr, then "
                     f"submit ({i})") for i in range(n)]

    def system_prompt(self):
        return "go[left], go[right] or submit"

    def _reset(self, task):
        self.state = ""
        return "start"

    def _execute(self, call: ToolCall) -> StepResult:
        if call.name == "submit":
            return StepResult("submitted", reward=self.verify(), done=True)
        d = call.arguments["direction"]
        if d not in ("left", "right"):
            raise ActionError("direction must be left or right")
        self.state += d[0]
        return StepResult(f"at {self.state}")

    def verify(self) -> float:
        SubmitCorridor.verifier_calls += 1
        return {"rr": 1.0, "rl": 0.25}.get(self.state[-2:], 0.0)


class UndeclaredSubmitCorridor(SubmitCorridor):
    """SubmitCorridor written against the contract before `ending_tools`: it names none."""

    name = "undeclared-submit-corridor"
    ending_tools = ()
class MinedCorridor(ListedCorridor):
    """ListedCorridor under its tasks' env name, so the mine stage takes its trees."""

    name = "corridor"


def scripted_sample(actions: list[str]):
    """A `Policy.sample` that answers each row with one of `actions`, picked by a hash of (prompt,
    temperature, seed), so batching cannot change it; its ids are the tokenizer's, so training
    reads them as generated. Patched over HFPolicy.sample, it scripts a real run's search."""
    import hashlib

    from offline_agent.policy.base import Completion

    def sample(self, prompts, n, sampling):
        assert n == 1
        out = []
        for p, t, s in zip(prompts, sampling.temperature, sampling.seed):
            key = hashlib.sha256(f"{p}/{t}/{s}".encode()).digest()
            text = actions[int.from_bytes(key[:4], "little") % len(actions)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append([Completion(text, ids, [-1.0] * len(ids), "stop", action_ids=ids)])
        return out

    return sample


class ScriptedPolicy:
    """Writes one of `actions` (scripted_sample); ranks choices by a hash."""

    def __init__(self, tokenizer, actions: list[str]):
        self.tokenizer = tokenizer
        self.sample = scripted_sample(actions).__get__(self)

    def choice_logprobs(self, prompts, choices):
        import hashlib

        return [[-(hashlib.sha256(f"{p}/{c}".encode()).digest()[0] % 7) / 3 for c in cs]
                for p, cs in zip(prompts, choices)]

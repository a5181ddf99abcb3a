"""Checks that an env keeps the Env contract, before a long run finds out the hard way.

`check_env(make_env)` runs each check on fresh env objects and returns one `CheckResult`
per check; `offline-agent check-env` prints them. A check that does not apply (no
demonstration, no hindsight) is skipped, not failed. An exception from the env's code
fails the check it happened in and names its type, so one broken method does not hide
the others.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable

from offline_agent.envs.base import ActionError, Env
from offline_agent.envs.parser import parse_action
from offline_agent.envs.testing.fuzz import named_cases, random_cases
from offline_agent.envs.testing.grammar_check import check_constrained_sampling, check_demo_grammar
from offline_agent.envs.testing.outcome import CheckFailed, CheckResult, CheckSkipped
from offline_agent.types import Task

MAX_OBSERVATION = 5000  # longest observation fuzzed text may produce
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object", "null"}


def check_env(make_env: Callable[[], Env], n_tasks: int = 20, n_fuzz: int = 300,
              seed: int = 0) -> list[CheckResult]:
    """Run every check; `make_env` builds a fresh env with the user's settings."""
    checks: list[tuple[str, Callable[[], str]]] = [
        ("tool schemas", lambda: check_tools(make_env().tools)),
        ("tasks", lambda: check_tasks(make_env, n_tasks)),
        ("snapshot/restore", lambda: check_round_trip(make_env, seed)),
        ("fuzzed text", lambda: check_fuzz(make_env(), n_fuzz, seed)),
        ("hindsight", lambda: check_hindsight(make_env, seed)),
        ("demonstration", lambda: check_demonstration(make_env)),
        ("demonstration in grammar", lambda: check_demo_grammar(make_env)),
        ("constrained sampling", lambda: check_constrained_sampling(make_env, seed=seed)),
    ]
    results = []
    for name, run in checks:
        try:
            results.append(CheckResult(name, True, run()))
        except CheckSkipped as e:
            results.append(CheckResult(name, None, str(e)))
        except CheckFailed as e:
            results.append(CheckResult(name, False, str(e)))
        except Exception as e:  # noqa: BLE001 - the env's own code broke; report, go on
            results.append(CheckResult(name, False, f"raised {type(e).__name__}: {e}"[:300]))
    return results


def check_tools(tools: list[dict]) -> str:
    """OpenAI/HF function specs: unique identifier names, object parameters, known types."""
    if not tools:
        raise CheckFailed("env.tools is empty")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise CheckFailed(f"tools[{i}] is not {{'type': 'function', 'function': {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise CheckFailed(f"tools[{i}] name {name!r} is not an identifier")
        if name.lower() in seen:
            raise CheckFailed(f"tool {name!r} is listed twice (names match case-insensitively)")
        seen.add(name.lower())
        _check_parameters(name, fn.get("parameters"))
    return f"{len(tools)} tools: {', '.join(t['function']['name'] for t in tools)}"


def _check_parameters(name: str, params: object) -> None:
    if not isinstance(params, dict) or params.get("type") != "object":
        raise CheckFailed(f"{name}.parameters must be a JSON schema with type 'object'")
    props = params.get("properties", {})
    if not isinstance(props, dict):
        raise CheckFailed(f"{name}.parameters.properties must be an object")
    for key, prop in props.items():
        if not isinstance(prop, dict) or prop.get("type") not in _JSON_TYPES:
            raise CheckFailed(f"{name}.{key} needs a 'type', one of {sorted(_JSON_TYPES)}")
    missing = [k for k in params.get("required", []) if k not in props]
    if missing:
        raise CheckFailed(f"{name} requires {missing}, which are not in its properties")


def check_tasks(make_env: Callable[[], Env], n: int) -> str:
    """Two fresh envs give the same tasks; ids are unique; train and test share no id and no
    task (instruction and data). A split may hold fewer than n tasks (a dataset's rows), never
    none."""
    splits = {}
    for split in ("train", "test"):
        first, again = make_env().tasks(split, n), make_env().tasks(split, n)
        if not first:
            raise CheckFailed(f"tasks({split!r}, {n}) returned no tasks")
        if len(first) > n or len(first) < n and len(make_env().tasks(split, 2 * n)) != len(first):
            raise CheckFailed(f"tasks({split!r}, {n}) returned {len(first)} tasks")
        if [t.to_dict() for t in first] != [t.to_dict() for t in again]:
            raise CheckFailed(f"tasks({split!r}, {n}) differ between two envs with one seed")
        if len({t.id for t in first}) != len(first):
            raise CheckFailed(f"tasks({split!r}, {n}) repeat an id")
        wrong = [t.id for t in first if t.split != split]
        if wrong:
            raise CheckFailed(f"task {wrong[0]} from tasks({split!r}) has another split")
        splits[split] = first
    shared = {t.id for t in splits["train"]} & {t.id for t in splits["test"]}
    if shared:
        raise CheckFailed(f"train and test share the id {sorted(shared)[0][:60]!r}")
    test = {_content(t) for t in splits["test"]}
    same = [t for t in splits["train"] if _content(t) in test]
    if same:
        raise CheckFailed(f"train and test share the task {same[0].instruction[:60]!r}")
    return (f"{len(splits['train'])} train and {len(splits['test'])} test tasks, deterministic, "
            "disjoint")


def _content(task: Task) -> str:
    """What makes a task the same task: its instruction and its data."""
    return json.dumps([task.instruction, task.data], sort_keys=True, default=repr)


def check_round_trip(make_env: Callable[[], Env], seed: int = 0, episodes: int = 10) -> str:
    """After one action, a snapshot restored into a fresh env replays the same observations
    as the original env for the next actions; and at every step of random episodes, a
    snapshot restored into a fresh env gives the next action the same outcome as the env it
    was taken from (episode state kept outside `self.state` shows up here)."""
    steps = _restore_every_step(make_env, seed, episodes)
    env = make_env()
    task = env.tasks("train", 1)[0]
    first = env.reset(task)
    if make_env().reset(task) != first:
        raise CheckFailed("reset(task) gives different first observations in two envs")
    actions = _probe_actions(env)
    env.act(actions[0])
    blob = env.snapshot()
    rest = actions[1:4]
    want = [_outcome(env, a) for a in rest]
    other = make_env()
    other.restore(blob)
    got = [_outcome(other, a) for a in rest]
    for action, w, g in zip(rest, want, got):
        if w != g:
            raise CheckFailed(f"after restore, {action[:40]!r} gave {g!r:.100} instead of {w!r:.100}")
    size = len(json.dumps(blob))
    return (f"{steps} steps of {episodes} random episodes and {len(rest)} probe actions play "
            f"alike on a fresh env restored from a snapshot ({size} bytes of JSON)")


def _restore_every_step(make_env: Callable[[], Env], seed: int, episodes: int) -> int:
    """Replay random episodes; before each step, restore a snapshot of the env into a fresh
    one and play the step on both: the outcomes must match. Returns the steps compared."""
    rng = random.Random(seed)
    steps = 0
    for task in make_env().tasks("train", episodes):
        env = make_env()
        actions = _random_episode(make_env(), task, rng) or _probe_actions(env)[:env.max_steps]
        env.reset(task)
        for i, text in enumerate(actions):
            restored = make_env()
            restored.restore(env.snapshot())
            want, got = _outcome(env, text), _outcome(restored, text)
            if want != got:
                raise CheckFailed(f"{task.id} step {i + 1}: {text[:40]!r} gave {got!r:.100} on "
                                  f"a fresh env restored from a snapshot, {want!r:.100} on the "
                                  "env itself: keep all episode state in self.state")
            steps += 1
            if want[2]:
                break
    return steps


def _outcome(env: Env, text: str) -> tuple:
    _, result = env.act(text)
    return result.observation, result.reward, result.done, result.invalid


def _probe_actions(env: Env) -> list[str]:
    """The demonstration's actions, the first offered action, then fuzzed text."""
    episode = env.demo_episode()
    offered = env.available_actions()[:1]
    return [*(episode[1] if episode else []), *offered, *named_cases(env.tools)[:4]]


def check_fuzz(env: Env, n: int, seed: int) -> str:
    """Hostile text never raises from `act` and never makes a huge observation."""
    task = env.tasks("train", 1)[0]
    env.reset(task)
    texts = named_cases(env.tools) + random_cases(env.tools, n, seed)
    slowest, longest = 0.0, 0
    for text in texts:
        start = time.perf_counter()
        try:
            _, result = env.act(text)
        except Exception as e:  # noqa: BLE001 - this is what the check looks for
            raise CheckFailed(f"act raised {type(e).__name__} on {text[:60]!r}") from e
        slowest = max(slowest, time.perf_counter() - start)
        if len(result.observation) > MAX_OBSERVATION:
            raise CheckFailed(f"a {len(result.observation)}-char observation for {text[:60]!r}")
        longest = max(longest, len(result.observation))
        if result.done:
            env.reset(task)
    return f"{len(texts)} texts, no exception; slowest {slowest:.2f} s, longest {longest} chars"


def check_hindsight(make_env: Callable[[], Env], seed: int, episodes: int = 10) -> str:
    """Random episodes; wherever achieved_task() names a task, the same actions under it
    must earn reward 1. Skipped if no episode's end names one."""
    rng = random.Random(seed)
    checked = 0
    for task in make_env().tasks("train", episodes):
        env = make_env()
        actions = _random_episode(env, task, rng)
        achieved = env.achieved_task()
        if achieved is None:
            continue
        replay = make_env()
        replay.reset(achieved)
        result = None
        for text in actions:
            _, result = replay.act(text)
        if result is None or not result.done or result.reward != 1.0:
            raise CheckFailed(f"replaying {len(actions)} actions under achieved_task() "
                              f"{achieved.id!r} earned {result.reward if result else None}, not 1")
        checked += 1
    if not checked:
        raise CheckSkipped(f"achieved_task() is None after all {episodes} random episodes")
    return f"{checked} of {episodes} random episodes relabeled; each replays to reward 1"


def _random_episode(env: Env, task: Task, rng: random.Random) -> list[str]:
    """Offered actions at random, else the demonstration's; the texts played to the end."""
    env.reset(task)
    episode = env.demo_episode()
    scripted = list(episode[1]) if episode else []
    played: list[str] = []
    for step in range(env.max_steps):
        offered = env.available_actions()
        if offered:
            text = rng.choice(offered)
        elif scripted:
            text = scripted[step % len(scripted)]
        else:
            break
        played.append(text)
        if env.act(text)[1].done:
            break
    return played


def check_demonstration(make_env: Callable[[], Env]) -> str:
    """demo_episode() reaches reward 1 (demonstration() raises otherwise), and its actions
    survive the env's stop strings."""
    env = make_env()
    if env.demo_episode() is None:
        if env.demonstration():
            raise CheckFailed("demonstration() is overridden without demo_episode(), so it "
                              "cannot be replayed: implement demo_episode() instead")
        raise CheckSkipped("no demo_episode()")
    turns = env.demonstration()
    task, actions = env.demo_episode()
    env.reset(task)
    for i, text in enumerate(actions):
        result = env.act(text)[1]
        if result.invalid:
            raise CheckFailed(f"the demonstration's step {i + 1} {text[:40]!r} is an invalid "
                              f"action ({result.observation[:80]!r}); every prompt shows it, "
                              "so the policy would learn to write it")
        _check_cut(env, text)
    steps = sum(m.role == "assistant" for m in turns)
    return f"{steps} valid actions reach reward 1 and survive the stop strings {env.stop!r}"


def _check_cut(env: Env, action: str) -> None:
    """A reply that goes on after the action is cut at the env's first stop string, and
    the stop string is dropped (the policy contract): the action must parse the same."""
    reply = action + "\n\nResult: ..."
    cut = min((i for i in (reply.find(s) for s in env.stop) if i >= 0), default=len(reply))
    try:
        same = parse_action(reply[:cut], env.tools) == parse_action(action, env.tools)
    except ActionError:
        same = False
    if not same:
        raise CheckFailed(f"stop strings {env.stop!r} cut the demonstration's action "
                          f"{action[:40]!r} to {reply[:cut][-40:]!r}")


def summary(results: list[CheckResult]) -> str:
    """The verdict line: what failed, else how many passed; skipped checks counted apart."""
    failed = [r.name for r in results if r.ok is False]
    skipped = [r.name for r in results if r.ok is None]
    passed = sum(r.ok is True for r in results)
    counts = f"{passed} passed" + (f", {len(skipped)} skipped: {', '.join(skipped)}"
                                   if skipped else "")
    if failed:
        return f"FAILED: {', '.join(failed)}; {counts}"
    return "all checks passed" if not skipped else counts


def format_table(results: list[CheckResult]) -> str:
    """A short fixed-width pass/fail table."""
    width = max(len(r.name) for r in results)
    marks = {True: "pass", False: "FAIL", None: "skip"}
    return "\n".join(f"{r.name:<{width}}  {marks[r.ok]}  {r.detail}" for r in results)

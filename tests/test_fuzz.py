"""Model text never crashes an env: every built-in env takes the named hostile cases and
1,000 seeded mangled actions through `act` without an exception, in bounded time, with
short observations (issue 12, item 1).

The Python env's bulk runs against a recording stand-in for the sandbox, so a thousand
actions cost no subprocesses; what reaches the real sandbox here is the case that needs
it: code that forges the harness's result line (deep nesting, huge integers, long fields).
"""

from __future__ import annotations

import time

import pytest

from offline_agent.envs.base import load_env
from offline_agent.envs.python import harness
from offline_agent.envs.testing.fuzz import named_cases, random_cases
from offline_agent.sandbox import SandboxResult

N_RANDOM = 1000
MAX_OBSERVATION = 3000  # "a few thousand characters"
MAX_CALL_CPU_S = 1.0  # "no call over 1 s", in CPU time: a busy machine's waits do not count


def _fuzz(env, texts: list[str]) -> dict:
    """Act on every text (resetting after an episode ends); the slowest call (process CPU
    seconds, which other programs on the machine cannot inflate) and longest observation.
    An exception fails the test with the text that caused it."""
    task = env.tasks("test", 1)[0]
    env.reset(task)
    slowest, longest, valid = (0.0, ""), 0, 0
    for text in texts:
        start = time.process_time()
        try:
            _, result = env.act(text)
        except Exception as e:  # noqa: BLE001 - report which text broke it
            pytest.fail(f"{type(e).__name__} from {text[:120]!r}")
        slowest = max(slowest, (time.process_time() - start, text))
        longest = max(longest, len(result.observation))
        valid += not result.invalid
        if result.done:
            env.reset(task)
    return {"slowest": slowest, "longest": longest, "valid": valid}


@pytest.fixture
def fake_sandbox(monkeypatch):
    """The sandbox answers every program with a crash, and counts the calls."""
    calls = []

    def run(script: str, timeout_s: float, allow_weaker: bool = False) -> SandboxResult:
        calls.append(script)
        return SandboxResult(stdout="", stderr="killed", returncode=-9)

    monkeypatch.setattr(harness, "run_python", run)
    return calls


@pytest.mark.parametrize("name", ["math", "minishop", "python"])
def test_act_never_raises_on_hostile_text(name, fake_sandbox):
    env = load_env(name)
    texts = named_cases(env.tools) + random_cases(env.tools, N_RANDOM, seed=12)
    stats = _fuzz(env, texts)
    assert len(texts) >= N_RANDOM + 40
    assert stats["longest"] <= MAX_OBSERVATION
    cpu_s, text = stats["slowest"]
    assert cpu_s < MAX_CALL_CPU_S, f"act took {cpu_s:.2f} CPU s on {text[:120]!r}"
    assert stats["valid"] > 0  # the stream also reaches the tools, not only the parser
    if name == "python":
        assert len(fake_sandbox) == stats["valid"]


def test_random_cases_are_seeded():
    tools = load_env("math").tools
    assert random_cases(tools, 50, seed=1) == random_cases(tools, 50, seed=1)
    assert random_cases(tools, 50, seed=1) != random_cases(tools, 50, seed=2)


@pytest.mark.parametrize("tool", ["run_tests", "submit"])
def test_forged_result_lines_are_a_crash_not_an_exception(tool):
    """Code that writes its own marker line and exits: nesting past the recursion limit,
    an integer past str()'s digit limit, a 100k-char error field. Real sandbox."""
    forged = [
        '"[" * 100000',
        'json.dumps({"error": None, "stdout": "", "results": [["ok", "1" * 4400]] * 10})',
        '\'{"error": "\' + "e" * 100000 + \'", "stdout": "", "results": []}\'',
    ]
    env = load_env("python")
    task = env.tasks("test", 1)[0]
    for expr in forged:
        env.reset(task)
        code = (f"import json, os\nos.write(1, ('\\n{harness.MARKER}' + {expr} + '\\n')"
                ".encode())\nos._exit(0)")
        _, result = env.act(f"{tool}[{code}]")
        assert "the program crashed" in result.observation, result.observation[:200]
        assert len(result.observation) <= MAX_OBSERVATION and result.reward == 0.0


@pytest.mark.parametrize("text,reason", [
    ("<tool_call>null</tool_call>", "must be a JSON object, got NoneType"),
    ("<tool_call>[]</tool_call>", "must be a JSON object, got list"),
    ('{"name": "answer", "arguments": {"value": ' + "1" * 4400 + "}}", "no tool call found"),
    ("<tool_call>{\"name\": \"answer\", \"arguments\": {\"value\": " + "1" * 4400 + "}}",
     "invalid JSON in <tool_call>"),
    ("answer(0x" + "f" * 4000 + ")", "answer.value is too long"),
    ("answer(1" + "0" * 309 + ")", "answer.value is out of range"),
    ("answer[1e400]", "must be a finite number"),
])
def test_each_named_case_is_an_invalid_step_that_says_why(text, reason):
    env = load_env("math")
    env.reset(env.tasks("test", 1)[0])
    call, result = env.act(text)
    assert result.invalid and not result.done
    assert reason in result.observation


def test_echoed_names_and_keys_are_cut():
    env = load_env("minishop")
    env.reset(env.tasks("test", 1)[0])
    for text in ('{"name": "' + "n" * 1_000_000 + '"}', "x" * 100_000 + "(1)",
                 '{"name": "search", "arguments": {"' + "k" * 100_000 + '": 1}}'):
        _, result = env.act(text)
        assert result.invalid and len(result.observation) < 300, result.observation[:300]


def test_parsing_is_linear_in_unclosed_quotes():
    """calculate['\\'\\'... (20k chars) took 27 s: each escaped quote rescanned the rest of
    its line. Measured without a clock: the characters that quote scans visit."""
    from offline_agent.envs import parser

    visits = []
    real = parser._string_end

    def counting(text, start):
        end = real(text, start)
        visits.append((len(text) if end is None else end) - start)
        return end

    env = load_env("math")
    for size in (2_000, 9_000):
        text = "calculate['" + "\\'" * size
        visits.clear()
        parser._string_end = counting
        try:
            with pytest.raises(parser.ActionError, match="missing its closing"):
                parser.parse_action(text, env.tools)
        finally:
            parser._string_end = real
        assert sum(visits) <= 2 * len(text)


def test_unexpected_exceptions_become_invalid_steps_logged_once(caplog, monkeypatch):
    """The backstop: a bug in an env's own code, found by model text, is an invalid step."""
    from offline_agent.envs import base

    monkeypatch.setattr(base, "_LOGGED", set())  # what earlier tests logged does not count
    env = load_env("math")
    env.reset(env.tasks("test", 1)[0])

    def broken(call):
        raise KeyError("oops")

    monkeypatch.setattr(env, "_execute", broken)
    with caplog.at_level("WARNING"):
        first = env.act("calculate[1+1]")[1]
        second = env.act("calculate[2+2]")[1]
    assert first.invalid and "KeyError" in first.observation and env.num_steps == 2
    assert second.invalid
    assert sum("KeyError" in r.getMessage() for r in caplog.records) == 1


def test_a_failing_sandbox_is_raised_not_recorded_as_an_invalid_step(monkeypatch):
    """Model text never crashes a run, but the env's own machinery failing must not hide as
    an invalid action: the env maps SandboxError to EnvFailure, which goes up to the stage."""
    import pytest

    from offline_agent.envs.base import EnvFailure
    from offline_agent.envs.python import env as python_env
    from offline_agent.sandbox import SandboxError

    env = python_env.PythonTasks()
    task = env.tasks("train", 1)[0]
    env.reset(task)

    def broken(*args, **kwargs):
        raise SandboxError("cannot create the run's cgroup")

    monkeypatch.setattr(python_env, "run_cases", broken)
    with pytest.raises(EnvFailure, match="cannot create the run's cgroup") as raised:
        env.act('run_tests[def f(x):\n    return x]')
    assert isinstance(raised.value.__cause__, SandboxError)

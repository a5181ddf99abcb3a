"""Python tasks: the problem bank, hidden-test scoring in the sandbox, and the env protocol."""

from __future__ import annotations

import pytest

from offline_agent.envs.base import load_env
from offline_agent.envs.python import PythonTasks
from offline_agent.envs.python.harness import MARKER
from offline_agent.envs.python.problems import PROBLEMS
from offline_agent.envs.python.tasks import make_task, split_of


def _task(name: str, round_: int = 0):
    return make_task(next(p for p in PROBLEMS if p.name == name), round_, seed=0)


def _submit(code: str, task) -> tuple:
    env = PythonTasks()
    env.reset(task)
    return env, env.act(f"submit[{code}]")[1]


def test_bank_has_enough_distinct_problems_with_visible_and_hidden_tests():
    assert len({p.name for p in PROBLEMS}) == len(PROBLEMS) >= 30
    for problem in PROBLEMS:
        task = make_task(problem, 0, seed=0)
        assert 2 <= len(task.data["visible"]) <= 3 and len(task.data["hidden"]) >= 5


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_reference_solution_earns_full_reward(problem):
    """Every variant's reference, submitted as a model would, passes every hidden test."""
    for variant in range(len(problem.variants)):
        task = make_task(problem, variant, seed=0)
        _, result = _submit(problem.source(problem.variants[variant]), task)
        assert result.done and result.reward == 1.0, result.observation


def test_wrong_solution_earns_the_fraction_of_hidden_tests_it_passes():
    task = _task("is_prime")
    odd = sum((args[0] % 2 == 1) == expected for args, expected in task.data["hidden"])
    _, result = _submit("def is_prime(n):\n    return n % 2 == 1", task)
    assert 0 < odd < len(task.data["hidden"])
    assert result.reward == pytest.approx(odd / len(task.data["hidden"]))
    assert f"{odd}/{len(task.data['hidden'])} hidden tests passed" in result.observation


def test_one_endless_case_does_not_zero_the_others():
    task = _task("factorial")
    code = (
        "def factorial(n):\n"
        "    while n == 0:\n"
        "        pass\n"
        "    r = 1\n"
        "    for i in range(2, n + 1):\n"
        "        r *= i\n"
        "    return r"
    )
    zeros = sum(args == [0] for args, _ in task.data["hidden"])
    _, result = _submit(code, task)
    n = len(task.data["hidden"])
    assert zeros == 1 and result.reward == pytest.approx((n - 1) / n)


def test_run_tests_reports_pass_fail_and_errors_without_ending():
    env = PythonTasks()
    env.reset(_task("reverse_words"))
    _, result = env.act("run_tests[def reverse_words(s):\n    return s]")
    assert not result.done and result.reward == 0 and not result.invalid
    assert result.observation.startswith("0/2 tests passed")
    assert (
        "FAIL reverse_words('hello world'): expected 'world hello', got 'hello world'"
        in result.observation
    )
    _, result = env.act(
        "run_tests[def reverse_words(s):\n    print('debug')\n    return ' '.join(s.split()[::-1]) if s != 'a b c' else 1 / 0]"
    )
    assert "1/2 tests passed" in result.observation
    assert "ERROR reverse_words('a b c'): ZeroDivisionError: division by zero" in result.observation
    assert "Printed output:\ndebug" in result.observation


def test_code_that_passed_run_tests_is_listed_for_submission():
    """The listed action is the passing code's submit, exactly (code ending in `]` too), and
    only while the last run_tests passed every example."""
    env = PythonTasks()
    env.reset(_task("differences"))
    assert env.available_actions() == []
    good = "def differences(xs):\n    return [b - a for a, b in zip(xs, xs[1:])]"
    env.act(f"run_tests[{good}]")
    assert env.available_actions() == [f"submit[{good}]"]
    blob = env.snapshot()
    env.act("run_tests[def differences(xs):\n    return xs]")  # fails: nothing listed
    assert env.available_actions() == []
    env.restore(blob)
    call, result = env.act(env.available_actions()[0])
    assert call.name == "submit" and result.done and result.reward == 1.0
    assert env.available_actions() == []


def test_syntax_errors_and_missing_functions_are_reported():
    env = PythonTasks()
    env.reset(_task("count_evens"))
    _, result = env.act("run_tests[def count_evens(xs):\n    return len(xs]")
    assert "Error: SyntaxError" in result.observation and "(line 2)" in result.observation
    _, result = env.act("run_tests[def count_even(xs):\n    return 0]")
    assert "NameError: function 'count_evens' is not defined" in result.observation
    _, result = env.act("submit[def count_evens(xs) return 0]")
    assert result.done and result.reward == 0 and "SyntaxError" in result.observation


def test_cheating_return_values_and_fake_result_lines_earn_nothing():
    task = _task("sum_of_squares")
    always_equal = "class Eq:\n    def __eq__(self, other):\n        return True\ndef sum_of_squares(xs):\n    return Eq()"
    assert _submit(always_equal, task)[1].reward == 0
    fake = f'import json\nprint("{MARKER}" + json.dumps({{"error": None, "results": [["ok", "0"]] * 20, "stdout": ""}}))\ndef sum_of_squares(xs):\n    return -1'
    assert _submit(fake, task)[1].reward == 0


def test_tasks_are_deterministic_unbounded_and_split_by_problem():
    env = load_env("python")
    train, test = env.tasks("train", 100), env.tasks("test", 60)
    assert [t.to_dict() for t in train] == [t.to_dict() for t in PythonTasks().tasks("train", 100)]
    assert len({t.id for t in train}) == 100 and len({t.id for t in test}) == 60
    assert not {t.data["function"] for t in train} & {t.data["function"] for t in test}
    assert {split_of(p) for p in PROBLEMS} == {"train", "test"}
    assert {t.id for t in PythonTasks(seed=1).tasks("test", 60)} != {t.id for t in test}
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("dev", 1)


def test_snapshot_restore_reproduces_observations():
    env = PythonTasks()
    env.reset(_task("dedupe"))
    env.act("run_tests[def dedupe(xs):\n    return xs]")
    blob = env.snapshot()
    code = "submit[def dedupe(xs):\n    return sorted(set(xs))]"
    first = env.act(code)[1]
    assert env.act(code)[1].invalid  # the episode is over
    env.restore(blob)
    second = env.act(code)[1]
    assert (first.observation, first.reward, first.done) == (
        second.observation,
        second.reward,
        second.done,
    )
    assert 0 < first.reward < 1


def test_system_prompt_is_short_with_one_worked_example():
    prompt = PythonTasks().system_prompt()
    assert "run_tests[def double(x):" in prompt and "submit[" in prompt
    assert len(prompt.split()) < 120


@pytest.mark.parametrize(
    "forged",
    [
        '{"error": null, "results": [["ok", "5"]], "stdout": ""}',  # fewer results than tests
        '{"error": null, "results": "all passed", "stdout": ""}',
        "not json at all",
        "[]",
    ],
)
def test_forged_reports_written_after_the_harness_count_as_a_crash(forged):
    task = _task("sum_of_squares")
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: sys.__stdout__.write('\\n{MARKER}' + {forged!r} + '\\n'))\n"
        "def sum_of_squares(xs):\n"
        "    return sum(x * x for x in xs)"
    )
    _, result = _submit(code, task)
    assert result.done and result.reward == 0 and "crashed" in result.observation


def test_demonstration_runs_then_submits_a_train_problem():
    env = PythonTasks()
    task, actions = env.demo_episode()
    turns = env.demonstration()
    assert task.split == "train"
    assert [m.role for m in turns] == ["user", "assistant", "tool", "assistant", "tool"]
    assert actions[0].startswith("run_tests[def ") and actions[1].startswith("submit[def ")
    assert "tests passed" in turns[2].content
    assert turns[-1].content == f"Submitted: {len(task.data['hidden'])}/{len(task.data['hidden'])} hidden tests passed."


def test_code_that_lost_its_last_bracket_to_the_action_gets_it_back():
    """`submit[def f(xs):\n    return [x for x in xs]` (one "]" for both) is what the
    135M model writes; the parser ends the action at that "]", the env puts it back."""
    task = _task("flatten")
    _, result = _submit("def flatten(xss):\n    return [x for xs in xss for x in xs]", task)
    assert result.reward == 1.0, result.observation
    _, broken = _submit("def flatten(xss):\n    return [x for xs in xss for x in xs", task)
    assert broken.reward == 1.0
    _, result = _submit("def flatten(xss):\n    return (x for xs in xss", task)
    assert result.reward == 0.0 and "SyntaxError" in result.observation


def test_a_reply_that_ends_inside_the_code_closes_the_call_there():
    """`submit[def f(x):\n    return x + 1` then end of turn (no "]" at all) is the 135M
    model's most common reply; the end of the reply is the end of the call."""
    task = _task("negate")
    env = PythonTasks()
    env.reset(task)
    call, result = env.act("run_tests[def negate(x: int) -> int:\n    return -x")
    assert call is not None and not result.invalid and "2/2 tests passed" in result.observation
    call, result = env.act("submit[def negate(x: int) -> int:\n    return -x")
    assert call.name == "submit" and result.reward == 1.0
    env.reset(task)
    _, unopened = env.act("def negate(x: int) -> int:\n    return -x")
    assert unopened.invalid  # no tool named: still an invalid action

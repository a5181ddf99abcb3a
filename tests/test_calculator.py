"""Calculator math: safe evaluator, verifier, determinism, splits, snapshot/restore."""

from __future__ import annotations

import pytest

from offline_agent.envs.base import load_env
from offline_agent.envs.math import CalculatorMath
from offline_agent.envs.math.calculator import CalcError, evaluate, format_number


@pytest.mark.parametrize(
    "expression, value",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("-(3 + 4) * 2", -14),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("80 * (100 - 25) / 100 / 4", 15),
        ("1.5e3 + 0.5", 1500.5),
        ("+5", 5),
    ],
)
def test_evaluator_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os').system('echo hi')", "function calls not allowed"),
        ("(1).real", "attribute access not allowed"),
        ("x + 1", "names not allowed"),
        ("[1, 2][0]", "indexing not allowed"),
        ("[1, 2]", "List not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("2 ^ 3", "operator BitXor is not allowed"),
        ("9**9**9", "exponent 387420489 is too large"),
        ("10 ** 60", "result is too large"),
        ("99999999 * 99999999 * 99999999", "result is too large"),
        ("1e308 * 10", "result is too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "fractional power of a negative number"),
        ("1 +", "cannot parse"),
        ("(" * 500 + "1" + ")" * 500, "cannot parse"),
        ("lambda: 1", "Lambda not allowed"),
    ],
)
def test_evaluator_refuses(expression, message):
    with pytest.raises(CalcError) as err:
        evaluate(expression)
    assert message in str(err.value)


def test_format_number():
    assert [format_number(v) for v in (84.0, 84, 2.5, 1 / 3)] == ["84", "84", "2.5", "0.3333333333"]


def _env(**kwargs) -> CalculatorMath:
    return CalculatorMath(**kwargs)


def test_tasks_are_deterministic_disjoint_and_cover_levels():
    train, test = _env().tasks("train", 120), _env().tasks("test", 40)
    assert [t.to_dict() for t in train] == [t.to_dict() for t in _env().tasks("train", 120)]
    assert len({t.instruction for t in train}) == 120 and len(test) == 40
    assert not {t.instruction for t in train} & {t.instruction for t in test}
    assert {t.data["level"] for t in train} == {1, 2, 3}
    # another seed gives other problems, still never a test question in train
    other = _env(seed=7).tasks("train", 120)
    assert {t.id for t in other} != {t.id for t in train}
    assert not {t.instruction for t in other} & {
        t.instruction for t in _env(seed=7).tasks("test", 200)
    }
    assert not {t.instruction for t in other} & {t.instruction for t in test}


def test_level_three_uses_parentheses_percentages_and_division():
    for task in _env(levels=(3,)).tasks("train", 20):
        assert "(" in task.data["expression"] and "/" in task.data["expression"]
        assert "%" in task.instruction
        assert abs(task.data["answer"] * 100 - round(task.data["answer"] * 100)) < 1e-9


def test_unknown_level_or_split_is_an_error():
    with pytest.raises(ValueError, match="unknown math level"):
        _env(levels=(4,))
    with pytest.raises(ValueError, match="unknown split"):
        _env().tasks("dev", 1)


def test_scripted_optimal_trajectory_earns_one():
    env = load_env("math")
    for task in env.tasks("test", 9):
        env.reset(task)
        _, result = env.act(f"calculate[{task.data['expression']}]")
        assert not result.invalid and not result.done and result.reward == 0
        shown = result.observation.removeprefix("Result: ")
        _, result = env.act(f"answer[{shown}]")
        assert result.done and result.reward == 1.0 and result.info["correct"]


def test_wrong_answer_earns_zero_and_the_episode_ends():
    env = _env()
    task = env.tasks("train", 1)[0]
    env.reset(task)
    _, result = env.act(f"answer[{task.data['answer'] + 1}]")
    assert result.done and result.reward == 0.0 and "wrong" in result.observation
    _, again = env.act(f"answer[{task.data['answer']}]")
    assert again.invalid and again.reward == 0.0 and "episode is over" in again.observation


def test_bad_calculations_are_invalid_observations_not_exceptions():
    env = _env()
    env.reset(env.tasks("train", 1)[0])
    for text, message in [
        ("calculate[1/0]", "division by zero"),
        ("calculate[9**9**9]", "too large"),
        ("calculate[open('x')]", "not allowed"),
    ]:
        _, result = env.act(text)
        assert result.invalid and message in result.observation and not result.done


def test_snapshot_restore_reproduces_observations():
    env = _env(max_steps=5)
    task = env.tasks("train", 3)[2]
    env.reset(task)
    env.act("calculate[2+2]")
    blob = env.snapshot()
    first = [env.act(a)[1] for a in ("calculate[3*3]", f"answer[{task.data['answer']}]")]
    env.restore(blob)
    assert env.num_steps == 1
    second = [env.act(a)[1] for a in ("calculate[3*3]", f"answer[{task.data['answer']}]")]
    assert [(r.observation, r.reward, r.done) for r in first] == [
        (r.observation, r.reward, r.done) for r in second
    ]
    assert second[-1].reward == 1.0


def test_step_limit_ends_the_episode():
    env = _env(max_steps=2)
    env.reset(env.tasks("train", 1)[0])
    assert not env.act("calculate[1+1]")[1].done
    result = env.act("calculate[1+1]")[1]
    assert result.done and result.info["truncated"] and result.reward == 0


def test_system_prompt_is_short_and_has_a_worked_example():
    prompt = _env().system_prompt()
    assert "calculate[12*7]" in prompt and "answer[84]" in prompt
    assert len(prompt.split()) < 120  # well under 200 tokens
    assert _env().achieved_task() is None


def test_demonstration_solves_a_train_addition_problem_as_chat_turns():
    env = CalculatorMath()
    task, actions = env.demo_episode()
    turns = env.demonstration()
    assert task.split == "train" and "+" in task.data["expression"]
    assert task.instruction not in {t.instruction for t in env.tasks("test", 200)}
    assert [m.role for m in turns] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [m.content for m in turns if m.role == "assistant"] == actions
    assert turns[-1].content.endswith("is correct.")
    assert env.demonstration() is turns  # played once per env

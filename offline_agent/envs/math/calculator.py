"""The math env's calculator: arithmetic evaluated over an AST whitelist (never eval), with
bounds on magnitude and exponents, so model text costs bounded time and memory.
"""

from __future__ import annotations

import ast
import math
import operator

from offline_agent.envs.errors import ActionError

MAX_MAGNITUDE = 1e15  # any intermediate value beyond this is refused
MAX_EXPONENT = 64

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_ALLOWED = "numbers, + - * / // % ** and parentheses"


class CalcError(ActionError):
    """A refused or failed calculation; the env turns it into an invalid-step observation."""


def evaluate(expression: str) -> float:
    """Evaluate arithmetic over an AST whitelist; never eval, bounded time and size."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalcError(f"cannot parse {expression[:60]!r}: only {_ALLOWED}") from e
    try:
        return _eval(tree.body)
    except RecursionError as e:
        raise CalcError("expression is nested too deeply") from e


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise CalcError(f"only numbers are allowed, not {node.value!r}"[:80])
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _OPS:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed: only {_ALLOWED}")
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalcError("division by zero")
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _check(_OPS[type(node.op)](left, right))
    what = {
        ast.Name: "names",
        ast.Call: "function calls",
        ast.Attribute: "attribute access",
        ast.Subscript: "indexing",
    }.get(type(node), type(node).__name__)
    raise CalcError(f"{what} not allowed: only {_ALLOWED}")


def _check_power(base: float, exponent: float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"exponent {exponent} is too large (max {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalcError("division by zero")
    if base < 0 and not float(exponent).is_integer():
        raise CalcError("fractional power of a negative number")
    if abs(base) > 1 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise CalcError("result is too large")


def _check(value: complex) -> float:
    if isinstance(value, complex):
        raise CalcError("fractional power of a negative number")
    if abs(value) > MAX_MAGNITUDE or not math.isfinite(value):
        raise CalcError(f"result is too large (limit {MAX_MAGNITUDE:g})")
    return value


def format_number(value: float) -> str:
    """84.0 -> "84", 1/3 -> "0.3333333333": what a model can copy into answer[...]."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def is_correct(given: float, expected: float) -> bool:
    return math.isclose(given, expected, rel_tol=1e-6, abs_tol=1e-6)

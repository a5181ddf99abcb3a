"""The math env: arithmetic word problems with a calculator tool."""

from offline_agent.envs.math.env import CalculatorMath

__all__ = ["CalculatorMath"]

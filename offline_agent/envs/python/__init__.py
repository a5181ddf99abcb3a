"""The Python env: function-writing tasks graded by hidden tests in the sandbox."""

from offline_agent.envs.python.env import PythonTasks

__all__ = ["PythonTasks"]

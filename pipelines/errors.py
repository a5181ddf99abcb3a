"""The error a run's request ends in when the pipeline refuses it: its own module, so that
the runner and the modules it reaches (artifacts, stages) all raise it without importing
each other."""


class RunError(Exception):
    """A request the runner refuses (changed config, unknown stage, missing inputs)."""

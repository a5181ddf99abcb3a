"""The sandbox's own error: it knows nothing of envs (the Python env maps it to EnvFailure)."""


class SandboxError(RuntimeError):
    """The sandbox cannot be set up (safely) here; never raised for what user code does."""

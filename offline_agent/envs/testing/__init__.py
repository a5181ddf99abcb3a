"""The conformance kit for envs: `check.check_env` (what `offline-agent check-env` runs) and
the hostile and mangled action texts it acts on (`fuzz`)."""

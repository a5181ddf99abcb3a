"""Run untrusted Python (model-written code) in a throwaway, confined process.

`run_python(code)` is the entry point. What this machine provides is probed once
(`probe_isolation()`); `sandbox_report()` says which layers are active. A missing layer makes
`run_python` refuse unless the caller passes `allow_weaker=True`. The modules: process.py
builds and runs the confined child (the chain of tools, limits, clean-up), launcher.py is the
script the child runs first (mounts, pivot_root, uid drop, seccomp), cgroups.py creates each
run's cgroup. Nothing here imports the envs: SandboxError is the package's own error.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from offline_agent.sandbox import cgroups
from offline_agent.sandbox.errors import SandboxError
from offline_agent.sandbox.process import (
    FALLBACK_PROCS,
    SANDBOX_UIDS,
    TMPFS_MB,
    Isolation,
    SandboxResult,
    spawn,
)

__all__ = ["Isolation", "SandboxError", "SandboxResult", "probe_isolation", "require_isolation",
           "run_python", "sandbox_report"]

log = logging.getLogger(__name__)

LAYER_NEEDS = {
    "namespaces": "unshare --pid --net (CAP_SYS_ADMIN)",
    "private_fs": "namespaces, root, mount/pivot_root and a python3 under /usr",
    "drop_uid": "running as root (else the child runs as the caller's own uid)",
    "cgroups": "a writable cgroup (v2 with memory+pids delegated, or v1 memory and pids)",
    "seccomp": "libseccomp.so.2 loadable by the child's python",
}


def sandbox_report(iso: Isolation | None = None) -> dict[str, str]:
    """Layer -> what enforces it here, or "MISSING: what it needs"."""
    iso = iso or probe_isolation()
    active = {
        "namespaces": "pid + network + ipc + uts + cgroup namespaces",
        "private_fs": "tmpfs root: /usr read-only, private /proc, "
        f"{TMPFS_MB} MB tmpfs /work, /tmp, /dev/shm",
        "drop_uid": f"uids {SANDBOX_UIDS.start}-{SANDBOX_UIDS.stop - 1}, one per run",
        "cgroups": iso.cgroups.describe() if iso.cgroups else "",
        "seccomp": "no unshare/setns/clone(NEWUSER)/io_uring; sockets: UNIX, INET, INET6 only",
    }
    missing = iso.missing()
    report = {k: f"MISSING: {LAYER_NEEDS[k]}" if k in missing else v for k, v in active.items()}
    report["total_memory"] = (
        "cgroup memory cap = memory_mb (tmpfs included)"
        if iso.cgroups
        else f"RLIMIT_AS memory_mb/{FALLBACK_PROCS} x RLIMIT_NPROC {FALLBACK_PROCS}"
        + (f" + 3 x {TMPFS_MB} MB tmpfs" if "private_fs" not in missing else "")
    )
    report["python"] = iso.python
    return report


@functools.lru_cache(maxsize=1)
def probe_isolation() -> Isolation:
    """Probe once what confinement works here; refuse rather than run code as root unlimited."""
    for tool in ("prlimit", "unshare"):
        if shutil.which(tool) is None:
            raise SandboxError(f"the sandbox needs util-linux's `{tool}` on PATH")
    namespaces = _ok(["unshare", "--net", "--pid", "--fork", "--kill-child", "true"])
    base = Isolation(namespaces, False, False, cgroups.probe_cgroups(), False, sys.executable)
    if os.geteuid() == 0:
        base = dataclasses.replace(base, drop_uid=True, python=_root_python())
        in_usr = os.path.realpath(base.python).startswith("/usr/")
        trial = dataclasses.replace(base, private_fs=namespaces and in_usr)
        if trial.private_fs and spawn("print(1)", 5, 512, trial).stdout == "1\n":
            base = trial
    # seccomp counts only if the filter loads and then really refuses a new user namespace
    trial = dataclasses.replace(base, seccomp=True)
    code = "import ctypes\nprint(ctypes.CDLL(None, use_errno=True).unshare(0x10000000))"
    return trial if spawn(code, 5, 512, trial).stdout == "-1\n" else base


def _root_python() -> str:
    """An interpreter an unprivileged uid can run (the venv's may sit under /root, mode 700)."""
    taken = [u for u in SANDBOX_UIDS if _has_account(u)]
    if taken:
        raise SandboxError(f"uids {taken[:5]} of the sandbox range belong to accounts here")
    candidates = [sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    usable = [p for p in candidates if p and _world_executable(p)]
    if not usable:
        raise SandboxError(
            f"running as root, but no Python interpreter is executable by an unprivileged uid "
            f"(tried {candidates}); install a system python3 or run as a normal user"
        )
    return usable[0]


def _ok(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _world_executable(path: str) -> bool:
    """Whether any user can reach and execute `path` (every parent directory o+x)."""
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [real, *real.parents])


@functools.cache
def _warn_weaker(missing: tuple[str, ...]) -> None:
    log.warning("sandbox runs WITHOUT %s (allowed by the caller)", ", ".join(missing))


def run_python(
    code: str,
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation | None = None,
    allow_weaker: bool = False,
) -> SandboxResult:
    """Run `code` as a script in a fresh confined process; never raises for what the code does.

    `memory_mb` caps the whole run (all its processes and tmpfs files) where cgroups exist.
    `isolation` defaults to what `probe_isolation()` finds (tests pass weaker ones). Raises
    SandboxError if a layer is missing, unless `allow_weaker`.
    """
    return spawn(code, timeout_s, memory_mb, require_isolation(allow_weaker, isolation))


def require_isolation(allow_weaker: bool = False, isolation: Isolation | None = None) -> Isolation:
    """The isolation to use (default: probed); SandboxError if a layer is missing and the
    caller did not allow it; a warning, once, if it did."""
    iso = isolation or probe_isolation()
    if iso.missing():
        if not allow_weaker:
            needs = "; ".join(f"{k} (needs {LAYER_NEEDS[k]})" for k in iso.missing())
            raise SandboxError(
                f"refusing to run untrusted code: this machine lacks sandbox layers: {needs}. "
                f"To run anyway with less isolation, set allow_weaker=True "
                f"(python env: env.kwargs.allow_weaker_sandbox: true)"
            )
        _warn_weaker(tuple(iso.missing()))
    return iso

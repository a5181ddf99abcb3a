"""Run untrusted Python (model-written code) in a throwaway, resource-limited process.

The child is a chain of util-linux tools, so no Python runs between fork and exec
(`preexec_fn` is unsafe in a threaded parent such as one that loaded torch):

    prlimit (CPU, address space, processes, file size, no core)
      -> unshare --net --pid --fork        [when permitted: no network; every
                                             descendant dies with the namespace]
      -> setpriv --reuid UID               [when root: RLIMIT_NPROC is not enforced
                                             for uid 0, so a fork bomb needs a drop]
      -> /bin/sh (namespace init, so the interpreter is an ordinary process that
                  signals can kill and whose status is reported as 128 + signal)
      -> python -s -S -B -c RUN_MAIN       [no site-packages, no .pyc writes]

plus a new session (`killpg` of the whole group on timeout and after every run), a
fresh temp working directory deleted afterwards, and an environment built from an
allow-list (no tokens, keys or proxies). Without network namespaces, a prelude
removes the `socket` modules instead (weaker; user code can still use raw syscalls
via ctypes). Which mechanisms apply here is probed once: see `probe_isolation()`.
"""

from __future__ import annotations

import functools
import itertools
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Unassigned uids, one per run in turn: what a run leaves behind (zombies that a slow init
# has not reaped yet) then never counts against the next run's RLIMIT_NPROC, and concurrent
# runs cannot signal each other.
SANDBOX_UIDS = range(61000, 61256)
_run_counter = itertools.count(os.getpid())  # a different start in each process
MAX_PROCS = 64  # RLIMIT_NPROC for the sandbox uid (threads count too)
MAX_FILE_MB = 16  # RLIMIT_FSIZE: any single file, stdout and stderr included
MAX_OUTPUT_CHARS = 16000  # returned per stream; head and tail kept, middle elided
PY_FLAGS = ["-s", "-S", "-B"]  # not -I: it implies -E, which would ignore PYTHONHASHSEED

# main.py runs via -c so tracebacks name "main.py", not the random temp path (same code,
# same output); without a network namespace the socket modules are made unimportable first.
RUN_MAIN = (
    "import sys; sys.argv[0] = 'main.py'; "
    "exec(compile(open('main.py', encoding='utf-8').read(), 'main.py', 'exec'), "
    "{'__name__': '__main__', '__file__': 'main.py'})"
)
BLOCK_NET = "import sys; sys.modules.update(dict.fromkeys(('socket', '_socket', 'ssl', '_ssl'))); "


class SandboxError(RuntimeError):
    """The sandbox cannot be set up safely on this machine (never raised for user code)."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int
    timed_out: bool = False
    killed_reason: str | None = None  # "timeout" | "cpu_time" | "memory" | "file_size" | "signal N"


@dataclass(frozen=True)
class Isolation:
    """The confinement available on this machine."""

    namespaces: bool  # network + pid namespaces (needs CAP_SYS_ADMIN)
    drop_uid: bool  # running as root: run the child as an unprivileged uid (SANDBOX_UIDS)
    python: str  # an interpreter the child's uid can execute


@functools.lru_cache(maxsize=1)
def probe_isolation() -> Isolation:
    """Probe once what confinement works here; refuse rather than run code as root unlimited."""
    for tool in ("prlimit", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            raise SandboxError(f"the sandbox needs util-linux's `{tool}` on PATH")
    root = os.geteuid() == 0
    namespaces = (
        subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--kill-child", "true"],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if not root:
        return Isolation(namespaces=namespaces, drop_uid=False, python=sys.executable)
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
    return Isolation(namespaces=namespaces, drop_uid=True, python=usable[0])


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


def run_python(
    code: str,
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation | None = None,
) -> SandboxResult:
    """Run `code` as a script in a fresh confined process; never raises for what the code does.

    `isolation` defaults to what `probe_isolation()` finds (tests pass a weaker one).
    """
    iso = isolation or probe_isolation()
    uid = SANDBOX_UIDS[next(_run_counter) % len(SANDBOX_UIDS)]
    workdir = tempfile.mkdtemp(prefix="oa-sandbox-")
    try:
        if iso.drop_uid:
            os.chown(workdir, uid, uid)
        Path(workdir, "main.py").write_text(code, encoding="utf-8")
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                _argv(iso, uid, timeout_s, memory_mb),
                cwd=workdir,
                env=_child_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)  # also after a normal exit: leftover grandchildren die too
            proc.wait()
            stdout, stderr = _read_capped(out), _read_capped(err)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rc = proc.returncode
    return SandboxResult(stdout, stderr, rc, timed_out, _killed_reason(rc, timed_out, stderr, iso))


def _argv(iso: Isolation, uid: int, timeout_s: float, memory_mb: int) -> list[str]:
    cpu = int(timeout_s) + 1  # the wall timeout normally fires first; this catches threads
    argv = [
        "prlimit",
        f"--cpu={cpu}:{cpu + 1}",
        f"--as={memory_mb * 2**20}",
        f"--nproc={MAX_PROCS}",
        f"--fsize={MAX_FILE_MB * 2**20}",
        "--core=0",
        "--",
    ]
    if iso.namespaces:
        argv += ["unshare", "--net", "--pid", "--fork", "--kill-child", "--"]
    if iso.drop_uid:
        argv += [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]
    if iso.namespaces:  # an init that is not the interpreter: pid 1 ignores default-action signals
        argv += ["/bin/sh", "-c", '"$@"; exit $?', "sh"]
    run = RUN_MAIN if iso.namespaces else BLOCK_NET + RUN_MAIN
    return argv + [iso.python, *PY_FLAGS, "-c", run]


def _child_env(workdir: str) -> dict[str, str]:
    """Built from nothing, so no token, key or proxy of the parent can leak."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",  # deterministic set/dict-of-str order: same code, same output
        "PYTHONIOENCODING": "utf-8",
    }


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_capped(f) -> str:
    """Head and tail of a stream (errors and results tend to be at the end)."""
    size = f.seek(0, os.SEEK_END)
    half = MAX_OUTPUT_CHARS // 2
    f.seek(0)
    if size <= MAX_OUTPUT_CHARS:
        return f.read().decode("utf-8", "replace")
    head = f.read(half).decode("utf-8", "replace")
    f.seek(size - half)
    tail = f.read().decode("utf-8", "replace")
    return f"{head}\n...[{size - 2 * half} bytes elided]...\n{tail}"


def _killed_reason(rc: int, timed_out: bool, stderr: str, iso: Isolation) -> str | None:
    if timed_out:
        return "timeout"
    last = stderr.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError"):
        return "memory"
    if "File too large" in last:
        return "file_size"
    # the shell init reports a signal as 128 + N; without it Popen gives -N
    sig = rc - 128 if iso.namespaces and rc > 128 else -rc if rc < 0 else 0
    if sig == signal.SIGXCPU:
        return "cpu_time"
    if sig == signal.SIGXFSZ:
        return "file_size"
    return f"signal {sig}" if sig else None

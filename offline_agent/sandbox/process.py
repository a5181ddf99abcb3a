"""One confined process: the argv, environment, limits and clean-up of a sandbox run.

The child is a chain of util-linux tools and one launcher script, so no Python runs between
fork and exec in the parent (`preexec_fn` is unsafe in a threaded parent such as torch's):

    /bin/sh: join the run's fresh cgroup           [total memory + process caps]
      -> prlimit (CPU, address space, processes, file size, no core)
      -> unshare --mount --pid --net --ipc --uts --cgroup --fork --kill-child
      -> python -s -S -B -c launcher.py, as root, pid 1 of the new pid namespace:
         mounts a tmpfs root holding /usr read-only, a fresh /proc, size-capped tmpfs /work,
         /tmp and /dev/shm and five device nodes, pivot_roots into it and drops the old
         root; stays as the init (the run's uid can neither signal nor ptrace it); forks:
           -> setresuid(UID), no_new_privs, seccomp filter (no new namespaces, no io_uring,
              only UNIX/INET sockets), then main.py runs in that same interpreter

plus a new session (`killpg` on timeout and after every run) and an environment built from
an allow-list. `spawn` runs with the layers an `Isolation` names; which layers this machine
has, and refusing to run without them, is the package's (offline_agent/sandbox/__init__.py).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from offline_agent.sandbox import cgroups
from offline_agent.sandbox.cgroups import Cgroups
from offline_agent.sandbox.errors import SandboxError

# Unassigned uids, one per run in turn: what a run leaves behind never counts against the
# next run's RLIMIT_NPROC, and concurrent runs cannot signal each other.
SANDBOX_UIDS = range(61000, 61256)
_run_counter = itertools.count(os.getpid())  # a different start in each process
MAX_PROCS = 64  # processes (threads count too) of one run: cgroup pids.max and RLIMIT_NPROC
FALLBACK_PROCS = 4  # without cgroups: RLIMIT_NPROC, with RLIMIT_AS = memory_mb / this
MAX_FILE_MB = 16  # RLIMIT_FSIZE: any single file, stdout and stderr included
TMPFS_MB = 64  # each of /work, /tmp, /dev/shm (charged to the run's memory cap too)
MAX_OUTPUT_CHARS = 16000  # returned per stream; head and tail kept, middle elided
PY_FLAGS = ["-s", "-S", "-B"]  # not -I: it implies -E, which would ignore PYTHONHASHSEED

# The seccomp filter the launcher loads before exec'ing the interpreter (after
# no_new_privs): (errno, syscall, arg0 test, a, b) with tests 0 none, 4 ==, 5 >=, 7 masked ==.
# clone3 gets ENOSYS (its flags sit behind a pointer), so libc falls back to clone, whose
# flags are checked.
SECCOMP_RULES = [
    (1, "unshare", 0, 0, 0),
    (1, "setns", 0, 0, 0),
    (38, "clone3", 0, 0, 0),
    (1, "clone", 7, 0x10000000, 0x10000000),  # CLONE_NEWUSER
    # io_uring can open sockets without the socket syscall (IORING_OP_SOCKET)
    *[(1, f"io_uring_{op}", 0, 0, 0) for op in ("setup", "enter", "register")],
    # socket families: only AF_UNIX (1), AF_INET (2), AF_INET6 (10)
    *[(97, "socket", 4, fam, 0) for fam in (0, 3, 4, 5, 6, 7, 8, 9)],
    (97, "socket", 5, 11, 0),
]
LAUNCHER = Path(__file__).with_name("launcher.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Isolation:
    """The confinement available on this machine."""

    namespaces: bool  # pid + network (+ ipc, uts) namespaces: needs CAP_SYS_ADMIN
    private_fs: bool  # mount namespace with a tmpfs root (needs namespaces, root, python in /usr)
    drop_uid: bool  # running as root: run the child as an unprivileged uid (SANDBOX_UIDS)
    cgroups: Cgroups | None  # a writable cgroup for total memory + process caps
    seccomp: bool  # libseccomp loads: no new namespaces, only UNIX/INET sockets
    python: str  # an interpreter the child's uid can execute

    def missing(self) -> list[str]:
        """Layers this machine lacks (empty: full isolation)."""
        have = {
            "namespaces": self.namespaces,
            "private_fs": self.namespaces and self.private_fs,
            "drop_uid": self.drop_uid,
            "cgroups": self.cgroups is not None,
            "seccomp": self.seccomp,
        }
        return [name for name, ok in have.items() if not ok]


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int
    timed_out: bool = False
    killed_reason: str | None = None  # "timeout" | "cpu_time" | "memory" | "file_size" | "signal N"


def spawn(code: str, timeout_s: float, memory_mb: int, iso: Isolation) -> SandboxResult:
    """Run `code` as main.py under `iso`'s layers; never raises for what the code does."""
    uid = SANDBOX_UIDS[next(_run_counter) % len(SANDBOX_UIDS)]
    stage = tempfile.mkdtemp(prefix="oa-sandbox-")  # mode 0700: main.py, seen only by root
    try:
        cg_dirs = cgroups.create(iso.cgroups, memory_mb, MAX_PROCS + 8) if iso.cgroups else []
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise SandboxError(f"cannot create the run's cgroup: {e}") from e
    try:
        _prepare(stage, code, iso, uid)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            argv = _argv(iso, uid, timeout_s, memory_mb, stage, cg_dirs)
            proc = subprocess.Popen(
                argv,
                cwd="/",  # the launcher starts as root: '' on its sys.path must be safe
                env=_child_env(_workdir(iso, stage)),
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
        oom = cgroups.oom_kills(cg_dirs) if cg_dirs else 0
    finally:
        cgroups.remove(cg_dirs)
        shutil.rmtree(stage, ignore_errors=True)
    rc = proc.returncode
    reason = _killed_reason(rc, timed_out, stderr, iso, oom)
    return SandboxResult(stdout, stderr, rc, timed_out, reason)


def _private(iso: Isolation) -> bool:
    return iso.namespaces and iso.private_fs


def _workdir(iso: Isolation, stage: str) -> str:
    """The run's working directory as the child sees it."""
    return "/work" if _private(iso) else stage


def _prepare(stage: str, code: str, iso: Isolation, uid: int) -> None:
    """main.py, and either a mount point for the private root or a stage the uid owns."""
    Path(stage, "main.py").write_text(code, encoding="utf-8")
    if _private(iso):
        os.mkdir(Path(stage, "root"))
    elif iso.drop_uid:
        os.chown(stage, uid, uid)
        os.chown(Path(stage, "main.py"), uid, uid)


def _argv(
    iso: Isolation, uid: int, timeout_s: float, memory_mb: int, stage: str, cg_dirs: list[Path]
) -> list[str]:
    argv = []
    if cg_dirs:  # join the cgroup first, so that every later process is inside it
        join = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done'
        argv += ["/bin/sh", "-c", join + '; shift; exec "$@"', "sh"]
        argv += [*[str(d / "cgroup.procs") for d in cg_dirs], "--"]
    cpu = int(timeout_s) + 1  # the wall timeout normally fires first; this catches threads
    procs, per_process_mb = (
        (MAX_PROCS, memory_mb) if cg_dirs else (FALLBACK_PROCS, memory_mb // FALLBACK_PROCS)
    )
    argv += ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={per_process_mb * 2**20}"]
    argv += [f"--nproc={procs}", f"--fsize={MAX_FILE_MB * 2**20}", "--core=0", "--"]
    if iso.namespaces:
        argv += ["unshare", "--net", "--pid", "--ipc", "--uts", "--cgroup", "--fork"]
        argv += ["--kill-child", *(["--mount"] if _private(iso) else []), "--"]
    cfg = {
        "private_fs": _private(iso),
        "init": iso.namespaces,
        "drop_uid": iso.drop_uid,
        "seccomp": iso.seccomp,
        "seccomp_rules": SECCOMP_RULES,
        "root": f"{stage}/root",
        "stage": stage,
        "uid": uid,
        "tmpfs_mb": TMPFS_MB,
        "workdir": _workdir(iso, stage),
        "block_net": not iso.namespaces,
    }
    # one line, so tracebacks start `File "<string>", line 1` whatever the launcher holds
    run = "import sys; exec(sys.argv[1]); "
    run += f"exec(launch({cfg!r}), {{'__name__': '__main__', '__file__': 'main.py'}})"
    return argv + [iso.python, *PY_FLAGS, "-c", run, LAUNCHER]


def _child_env(workdir: str) -> dict[str, str]:
    """Built from nothing, so no token, key or proxy of the parent can leak."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": "/tmp" if workdir == "/work" else workdir,
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


def _killed_reason(rc: int, timed_out: bool, stderr: str, iso: Isolation, oom: int) -> str | None:
    if timed_out:
        return "timeout"
    last = stderr.rstrip().rsplit("\n", 1)[-1]
    if oom or last.startswith("MemoryError"):
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

"""The sandbox must contain hostile code while the calling process keeps running."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from offline_agent import sandbox
from offline_agent.sandbox import SandboxError, probe_isolation, run_python
from offline_agent.sandbox.process import MAX_FILE_MB, SANDBOX_UIDS

ISO = probe_isolation()
# what this machine allows, and the fallback used where namespaces are not permitted
MODES = {
    "probed": ISO,
    "no-namespaces": dataclasses.replace(ISO, namespaces=False, private_fs=False),
}
needs_uid_drop = pytest.mark.skipif(not ISO.drop_uid, reason="only when running as root")
needs_namespaces = pytest.mark.skipif(not ISO.namespaces, reason="no namespaces here")


def needs(layer: str):
    return pytest.mark.skipif(
        layer in ISO.missing(), reason=f"this machine lacks {layer}: {sandbox.LAYER_NEEDS[layer]}"
    )


def run(code: str, iso=ISO, **kw):
    """The behaviour tests run in whatever this machine provides (the escape tests below
    skip a layer that is missing; the refusal itself is tested on its own). The default time
    limit is generous: a busy machine must not turn a slow start into a timeout."""
    kw.setdefault("timeout_s", 60)
    return run_python(code, isolation=iso, allow_weaker=True, **kw)


def _pids_with_env(token: str) -> list[int]:
    """Live (non-zombie) processes whose initial environment contains `token`."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if token.encode() in (d / "environ").read_bytes():
                found.append(int(d.name))
        except (OSError, ValueError):
            continue
    return found


def _wait_gone(probe, deadline_s: float = 60.0) -> list:
    """Polls until nothing is left; the deadline only bounds a failing test (generous: a
    busy machine reaps slowly, and a passing test returns as soon as all are gone)."""
    end = time.monotonic() + deadline_s
    while (left := probe()) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def test_plain_run_and_output():
    r = run("import sys\nprint('hi')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (r.stdout, r.stderr.strip(), r.returncode) == ("hi\n", "err", 3)
    assert not r.timed_out and r.killed_reason is None


def test_tracebacks_are_deterministic_and_workdir_removed(monkeypatch):
    made = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(
        tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1]
    )
    r = run("import os\nprint(os.getcwd())\n1/0")
    assert 'File "main.py", line 3' in r.stderr and "ZeroDivisionError" in r.stderr
    assert len(made) == 1 and not Path(made[0]).exists()  # the run's temp directory is deleted


def test_output_is_truncated():
    r = run("print('x' * 1_000_000)")
    assert len(r.stdout) < 20_000 and "bytes elided" in r.stdout


def test_infinite_loop_times_out_and_is_killed(iso):
    r = run("while True:\n    pass", timeout_s=1, iso=iso)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode != 0


def test_huge_allocation_fails():
    r = run("x = bytearray(10 * 2**30)\nprint('allocated')", memory_mb=256)
    assert "allocated" not in r.stdout
    assert r.killed_reason == "memory" and r.returncode != 0


def test_huge_file_is_limited():
    code = (
        "import os\n"
        "try:\n"
        "    with open('big.bin', 'wb') as f:\n"
        "        for _ in range(200):\n"
        "            f.write(b'x' * 2**20)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "print(os.path.getsize('big.bin'))\n"
    )
    r = run(code)
    assert "refused 27" in r.stdout  # EFBIG
    assert int(r.stdout.split()[-1]) <= MAX_FILE_MB * 2**20


@pytest.fixture(params=sorted(MODES))
def iso(request):
    return MODES[request.param]


def test_fork_limit_refuses_new_processes(iso):
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(1000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('refused after', n)\n"
    )
    r = run(code, timeout_s=60, iso=iso)
    assert "refused after" in r.stdout and not r.timed_out
    assert int(r.stdout.split()[-1]) < 100


def test_fork_bomb_is_contained_and_cleaned_up(iso):
    bomb = (
        "import os\n"
        "print(os.getuid(), flush=True)\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    r = run(bomb, timeout_s=1.5, iso=iso)
    assert r.timed_out
    if iso.drop_uid:  # every process of the run's uid is gone (zombies aside)
        assert _wait_gone(lambda: _uid_processes(int(r.stdout.split()[0]))) == []


def _uid_processes(uid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            status = (d / "status").read_text()
        except (OSError, ValueError):
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and "Z" not in fields.get("State", ""):
            out.append(int(d.name))
    return out


def _spawn_sleeper(token: str, new_session: bool) -> str:
    return (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        f"                 env={{'MARK': {token!r}}}, start_new_session={new_session})\n"
        "print('spawned')\n"
    )


def test_grandchild_left_running_is_killed_with_the_group(iso):
    token = f"oa-{uuid.uuid4().hex}"
    r = run(_spawn_sleeper(token, new_session=False), iso=iso)
    assert r.stdout == "spawned\n" and not r.timed_out
    assert _wait_gone(lambda: _pids_with_env(token)) == []


@needs_namespaces
def test_grandchild_that_escapes_the_group_still_dies_with_the_namespace():
    token = f"oa-{uuid.uuid4().hex}"
    r = run(_spawn_sleeper(token, new_session=True))
    assert r.stdout == "spawned\n"
    assert _wait_gone(lambda: _pids_with_env(token)) == []


def test_secrets_are_not_in_the_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_sekrit123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_sekrit456")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    r = run("import json, os\nprint(json.dumps(dict(os.environ)))")
    env = json.loads(r.stdout)
    assert "sekrit" not in r.stdout
    assert not [k for k in env if k.endswith(("_TOKEN", "_KEY")) or "PROXY" in k.upper()]


@needs_uid_drop
def test_secrets_are_not_readable_from_other_processes(monkeypatch):
    """Not even through /proc/<pid>/environ of the parent (the child runs as another uid)."""
    monkeypatch.setenv("HF_TOKEN", "hf_sekrit789")
    code = (
        "import os\n"
        "hits = 0\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        hits += b'hf_sekrit789' in open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print('hits', hits, 'uid', os.getuid())\n"
    )
    # the parent's own environ is fixed at exec, so check a fresh process that has the token
    holder = subprocess.Popen(["sleep", "5"], env={"HF_TOKEN": "hf_sekrit789"})
    try:
        r = run(code)
    finally:
        holder.kill()
        holder.wait()
    hits, uid = r.stdout.split()[1::2]
    assert hits == "0" and int(uid) in SANDBOX_UIDS


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


def _connect_code(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
        "try:\n"
        "    socket.getaddrinfo('pypi.org', 443)\n"
        "    print('resolved')\n"
        "except OSError as e:\n"
        "    print('no dns', type(e).__name__)\n"
    )


def _nothing_accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return False
    except BlockingIOError:
        return True


@needs_namespaces
def test_no_network_in_the_namespace(listener):
    r = run(_connect_code(listener.getsockname()[1]))
    assert "blocked" in r.stdout and "no dns" in r.stdout, r
    assert _nothing_accepted(listener)


def test_no_network_without_namespaces_via_blocked_socket_module(listener):
    """The fallback used where unshare is not permitted: `socket` cannot even be imported."""
    r = run(_connect_code(listener.getsockname()[1]), iso=MODES["no-namespaces"])
    assert "import of socket halted" in r.stderr and "connected" not in r.stdout
    assert _nothing_accepted(listener)


def _kill_code(pid: int) -> str:
    return (
        "import os, signal\n"
        "try:\n"
        f"    os.kill({pid}, signal.SIGKILL)\n"
        "    print('killed')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
    )


@needs("drop_uid")
def test_the_callers_processes_cannot_be_signalled(iso):
    """Hostile code cannot kill the caller's processes (another pid namespace, or another
    uid); the control, same uid and no namespaces, does kill one."""
    victims = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        r = run(_kill_code(victims[0].pid), iso=iso)
        assert r.stdout.split()[0] == "blocked" and victims[0].poll() is None, r
        same_uid = dataclasses.replace(MODES["no-namespaces"], drop_uid=False)
        control = run(_kill_code(victims[1].pid), iso=same_uid)
        assert control.stdout == "killed\n" and victims[1].wait(timeout=30) == -9, control
    finally:
        for v in victims:
            v.kill()
            v.wait()


# ---- escapes found by a hostile-model review (issue 12): each blocked, each with a control
# that shows the same code escapes when that layer is switched off, so the test can fail.

PROJECT = Path(sandbox.__file__).resolve().parents[2]
WITHOUT_FS = dataclasses.replace(ISO, private_fs=False)


def _readable_run_dir() -> Path:
    """A run dir as main created them (umask 022: world-readable) holding a store."""
    d = Path(tempfile.mkdtemp(prefix="oa-test-run-"))
    d.chmod(0o755)
    (d / "store.duckdb").write_bytes(b"DUCK" + b"secret trajectories")
    (d / "store.duckdb").chmod(0o644)
    return d


def _read_code(paths: list[str]) -> str:
    return (
        "import sys\n"
        f"sys.path.insert(0, {str(PROJECT)!r})\n"
        "for p in %r:\n"
        "    try:\n"
        "        open(p, 'rb').read(1)\n"
        "        print('READ', p)\n"
        "    except OSError as e:\n"
        "        print('blocked', type(e).__name__)\n"
        "try:\n"
        "    from offline_agent.envs.python.problems import PROBLEMS\n"
        "    print('IMPORTED', len(PROBLEMS))\n"
        "except ImportError as e:\n"
        "    print('blocked', type(e).__name__)\n"
    ) % (paths,)


@needs("private_fs")
def test_reference_solutions_and_run_stores_are_invisible():
    run_dir = _readable_run_dir()
    problems = str(PROJECT / "offline_agent/envs/python/problems.py")
    try:
        paths = [problems, str(run_dir / "store.duckdb"), "/etc/passwd", "/root/.bashrc"]
        code = _read_code(paths)
        r = run(code)
        assert "READ" not in r.stdout and "IMPORTED" not in r.stdout, r
        assert r.stdout.count("blocked") == len(paths) + 1
        control = run(code, iso=WITHOUT_FS)  # the project and the store are world-readable
        assert f"READ {problems}" in control.stdout and "IMPORTED" in control.stdout
        assert f"READ {run_dir / 'store.duckdb'}" in control.stdout
    finally:
        shutil.rmtree(run_dir)


def _cheat(name: str, variant: int) -> str:
    """What a hostile policy submitted: the project's own reference solution."""
    return (
        f"import sys\nsys.path.insert(0, {str(PROJECT)!r})\n"
        "from offline_agent.envs.python.problems import PROBLEMS\n"
        f"_p = next(p for p in PROBLEMS if p.name == {name!r})\n"
        f"exec(_p.source(_p.variants[{variant}]))\n"
    )


@needs("private_fs")
def test_submitting_the_reference_solution_by_import_earns_nothing(monkeypatch):
    from offline_agent.envs.python import PythonTasks
    from offline_agent.envs.python.problems import PROBLEMS
    from offline_agent.envs.python.tasks import make_task

    def submit(iso) -> list[float]:
        monkeypatch.setattr(sandbox, "probe_isolation", lambda: iso)
        env = PythonTasks(allow_weaker_sandbox=True)
        rewards = []
        for problem in PROBLEMS[:3]:
            task = make_task(problem, 0, seed=0)
            env.reset(task)
            code = _cheat(problem.name, task.data["variant"])
            rewards.append(env.act(f"submit[{code}]")[1].reward)
        return rewards

    assert submit(ISO) == [0.0, 0.0, 0.0]
    assert submit(WITHOUT_FS) == [1.0, 1.0, 1.0]  # the exploit the issue reports


def _proc_code() -> str:
    return (
        "import os\n"
        "for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):\n"
        "    try:\n"
        "        print(pid, open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ')[:80])\n"
        "    except OSError as e:\n"
        "        print(pid, type(e).__name__)\n"
    )


@needs("private_fs")
def test_proc_shows_only_the_sandbox():
    r = run(_proc_code())
    lines = r.stdout.splitlines()
    assert lines and len(lines) <= 3, r  # the launcher (pid 1) and the interpreter
    assert "pytest" not in r.stdout
    control = run(_proc_code(), iso=MODES["no-namespaces"])
    assert "pytest" in control.stdout


@needs("private_fs")
def test_tmp_and_shm_are_private_capped_and_gone_after_the_run():
    token = uuid.uuid4().hex
    code = (
        "import os\n"
        "for d in ('/tmp', '/dev/shm'):\n"
        f"    open(f'{{d}}/oa-escape-{token}', 'w').write('x')\n"
        "    total = 0\n"
        "    try:\n"
        "        for i in range(40):  # 40 files x 8 MB, each under the 16 MB file cap\n"
        "            with open(f'{d}/fill{i}', 'wb') as f:\n"
        "                f.write(b'x' * (8 << 20))\n"
        "            total += 8\n"
        "    except OSError as e:\n"
        "        print(d, 'full at', total, 'MB', e.errno)\n"
    )
    r = run(code, timeout_s=60)
    assert r.stdout.splitlines() == [
        f"/tmp full at {sandbox.TMPFS_MB - 8} MB 28",  # ENOSPC
        f"/dev/shm full at {sandbox.TMPFS_MB - 8} MB 28",
    ], r
    leftovers = [Path(d, f"oa-escape-{token}") for d in ("/tmp", "/dev/shm")]
    assert not any(p.exists() for p in leftovers)
    control = run(f"open('/dev/shm/oa-escape-{token}', 'w').write('x')", iso=WITHOUT_FS)
    try:
        assert control.returncode == 0 and leftovers[1].exists()
    finally:
        leftovers[1].unlink(missing_ok=True)


THREE_CHILDREN = """
import os, select, time
r, w = os.pipe()
pids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            block = b'x' * (300 << 20)  # written, so really resident
        except MemoryError:
            os._exit(1)
        os.write(w, b'%d' % i)
        time.sleep(60)
        os._exit(0)
    pids.append(pid)
held, dead = set(), set()
while len(held | dead) < 3:  # until every child holds its block or has died
    if select.select([r], [], [], 0.1)[0]:
        held |= {int(c) for c in os.read(r, 3).decode()}
    dead |= {i for i, p in enumerate(pids) if i not in dead and os.waitpid(p, os.WNOHANG)[0]}
print('held at once', len(held - dead))
"""


@pytest.mark.parametrize("total", ["cgroups", "rlimits"])
def test_three_300mb_children_do_not_fit_in_the_memory_cap(total):
    if total == "cgroups" and ISO.cgroups is None:
        pytest.skip(f"this machine lacks cgroups: {sandbox.LAYER_NEEDS['cgroups']}")
    iso = ISO if total == "cgroups" else dataclasses.replace(ISO, cgroups=None)
    r = run(THREE_CHILDREN, memory_mb=512, timeout_s=60, iso=iso)
    held = int(r.stdout.split()[-1]) if r.stdout else 0
    assert held < 3, r
    if total == "cgroups":
        assert r.killed_reason == "memory"
    control = run(THREE_CHILDREN, memory_mb=4096, timeout_s=60, iso=iso)
    assert control.stdout.split()[-1] == "3", control


@pytest.fixture
def unix_listeners():
    """A path socket anyone may connect to, and an abstract one."""
    d = Path(tempfile.mkdtemp(prefix="oa-test-sock-"))
    d.chmod(0o755)
    path = socket.socket(socket.AF_UNIX)
    path.bind(str(d / "s"))
    (d / "s").chmod(0o777)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0oa-test-{uuid.uuid4().hex}")
    for s in (path, abstract):
        s.listen()
        s.setblocking(False)
    yield path, abstract
    path.close()
    abstract.close()
    shutil.rmtree(d)


def _unix_connect_code(addresses: list[str]) -> str:
    return (
        "import socket\n"
        f"for a in {addresses!r}:\n"
        "    try:\n"
        "        socket.socket(socket.AF_UNIX).connect(a)\n"
        "        print('connected')\n"
        "    except OSError as e:\n"
        "        print('blocked', type(e).__name__)\n"
    )


@needs("private_fs")
def test_unix_sockets_of_the_host_are_unreachable(unix_listeners):
    addresses = [s.getsockname() for s in unix_listeners]
    addresses = [a if isinstance(a, str) else a.decode() for a in addresses]
    r = run(_unix_connect_code(addresses))
    assert r.stdout.split() == [
        "blocked",
        "FileNotFoundError",
        "blocked",
        "ConnectionRefusedError",
    ], r
    assert all(_nothing_accepted(s) for s in unix_listeners)
    control = run(_unix_connect_code(addresses[:1]), iso=WITHOUT_FS)
    assert control.stdout == "connected\n", control


USERNS = (
    "import ctypes, subprocess\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
    "print('tool', subprocess.run(['unshare', '--user', 'true'], capture_output=True).returncode)\n"
)


@needs("seccomp")
def test_no_new_user_namespaces():
    r = run(USERNS)
    assert r.stdout.split() == ["unshare", "-1", "1", "tool", "1"], r  # EPERM
    control = run(USERNS, iso=dataclasses.replace(ISO, seccomp=False))
    assert control.stdout.split()[:2] == ["unshare", "0"], control


@needs("seccomp")
def test_only_unix_and_inet_sockets():
    code = (
        "import socket\n"
        "for fam in ('AF_UNIX', 'AF_INET', 'AF_INET6', 'AF_NETLINK', 'AF_PACKET'):\n"
        "    try:\n"
        "        socket.socket(getattr(socket, fam), socket.SOCK_DGRAM).close()\n"
        "        print(fam, 'ok')\n"
        "    except OSError as e:\n"
        "        print(fam, e.errno)\n"
    )
    r = run(code)
    assert r.stdout.split() == [
        "AF_UNIX",
        "ok",
        "AF_INET",
        "ok",
        "AF_INET6",
        "ok",
        "AF_NETLINK",
        "97",
        "AF_PACKET",
        "97",
    ], r


@needs("cgroups")
def test_run_cgroups_are_removed():
    created = []
    real_create = sandbox.cgroups.create
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            sandbox.cgroups, "create", lambda *a: created.append(real_create(*a)) or created[-1]
        )
        run("import os\nfor _ in range(3):\n    os.fork() or os._exit(0)\nprint('ok')")
    assert created and not any(d.exists() for d in created[0])


# ---- refusal and self-report


def test_report_names_every_layer():
    report = sandbox.sandbox_report(ISO)
    assert set(report) >= {
        "namespaces",
        "private_fs",
        "drop_uid",
        "cgroups",
        "seccomp",
        "total_memory",
    }
    for layer in ISO.missing():
        assert report[layer].startswith("MISSING")
    weak = dataclasses.replace(ISO, cgroups=None, seccomp=False)
    report = sandbox.sandbox_report(weak)
    assert report["cgroups"].startswith("MISSING") and report["seccomp"].startswith("MISSING")
    assert "RLIMIT_AS" in report["total_memory"]


def test_missing_layer_is_refused_unless_allowed(caplog):
    weak = dataclasses.replace(ISO, cgroups=None)
    with pytest.raises(SandboxError, match="cgroups"):
        run_python("print(1)", isolation=weak)
    sandbox._warn_weaker.cache_clear()
    with caplog.at_level("WARNING", logger=sandbox.__name__):
        outs = [run_python("print(1)", isolation=weak, allow_weaker=True).stdout for _ in range(2)]
    assert outs == ["1\n", "1\n"]
    assert [r.getMessage() for r in caplog.records].count(
        f"sandbox runs WITHOUT {', '.join(weak.missing())} (allowed by the caller)"
    ) == 1


@pytest.mark.skipif(bool(ISO.missing()), reason=f"this machine lacks {ISO.missing()}")
def test_full_isolation_runs_without_opt_in():
    assert run_python("print(1)").stdout == "1\n"


def test_cgroup_parents_are_found_under_the_callers_own_cgroup():
    v1 = (
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "22 1 8:1 / / rw - ext4 /dev/vda rw\n"
    )
    own = "8:pids:/\n4:memory:/api/abc\n1:cpu,cpuacct:/\n0::/\n"
    assert sandbox.cgroups.find_parents(v1, own) == {
        "memory": "/sys/fs/cgroup/memory/api/abc",
        "pids": "/sys/fs/cgroup/pids",
        "unified": "/sys/fs/cgroup/unified",
    }
    v2 = "30 22 0:26 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
    assert sandbox.cgroups.find_parents(v2, "0::/user.slice/u.service\n") == {
        "unified": "/sys/fs/cgroup/u.service"
    }
    assert sandbox.cgroups.find_parents(v2, "0::/elsewhere\n") == {}  # not below the mount


def test_python_env_refuses_at_construction_unless_allowed(monkeypatch):
    from offline_agent.envs.base import load_env

    weak = dataclasses.replace(ISO, seccomp=False)
    monkeypatch.setattr(sandbox, "probe_isolation", lambda: weak)
    with pytest.raises(SandboxError, match="seccomp"):
        load_env("python")
    from offline_agent.envs.python.problems import PROBLEMS
    from offline_agent.envs.python.tasks import make_task

    env = load_env("python", allow_weaker_sandbox=True)  # as config env.kwargs would pass it
    problem = PROBLEMS[0]
    env.reset(make_task(problem, 0, seed=0))
    result = env.act(f"submit[{problem.source(problem.variants[0])}]")[1]
    assert result.reward == 1.0, result.observation


@needs("cgroups")
def test_cgroups_left_by_a_dead_process_are_removed_by_the_next_probe():
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now names no process
    stale = [
        Path(p, f"{sandbox.cgroups.PREFIX}{gone.pid}-0")
        for p in {ISO.cgroups.memory_parent, ISO.cgroups.pids_parent}
    ]
    mine = [
        Path(p, f"{sandbox.cgroups.PREFIX}{os.getpid()}-999999")
        for p in {ISO.cgroups.memory_parent}
    ]
    for d in stale + mine:
        d.mkdir()
    try:
        assert sandbox.cgroups.probe_cgroups() == ISO.cgroups
        assert not any(d.exists() for d in stale) and all(d.exists() for d in mine)
    finally:
        sandbox.cgroups.remove(stale + mine)

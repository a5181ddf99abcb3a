"""The sandbox's in-child launcher: a standalone script (stdlib only, no project imports).

process.py runs `python -s -S -B -c "exec(<this file>); exec(launch(cfg), ...)"`
inside the new namespaces, as root where the parent is root. One interpreter does what would
otherwise take some twenty short-lived tools and a second interpreter: build the private
root (mounts, pivot_root), stay as the pid namespace's init (reaping orphans, reporting a
signal death as 128 + N like a shell), and in a forked child drop to the run's uid, set
no_new_privs, load the seccomp filter and return main.py compiled, which the caller's line
executes at top level (so tracebacks look as they would for `python main.py`). It imports
only ctypes: start-up time is most of a sandboxed run's cost.
"""

import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
SECCOMP_ALLOW = 0x7FFF0000
SECCOMP_ERRNO = 0x00050000

libc = ctypes.CDLL(None, use_errno=True)


def check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox setup: {what}: {os.strerror(err)}")


def mount(source, target, fstype=None, flags=0, data=None):
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def bind_ro(source, target, extra=0):
    mount(source, target, flags=MS_BIND)
    mount(None, target, flags=MS_REMOUNT | MS_BIND | MS_RDONLY | extra)


def build_root(cfg):
    """A tmpfs root holding /usr (read-only), /proc, /dev and tmpfs /work, /tmp, /dev/shm."""
    root, uid, size = cfg["root"], cfg["uid"], f"size={cfg['tmpfs_mb']}m"
    mount(None, "/", flags=MS_REC | MS_PRIVATE)
    mount("oa-root", root, "tmpfs", 0, "size=1m,mode=755")
    os.chdir(root)
    for d in ("usr", "proc", "tmp", "dev", "work"):
        os.mkdir(d)
    for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged /usr or not
        if os.path.islink(f"/{d}"):
            os.symlink(os.readlink(f"/{d}"), d)
        elif os.path.isdir(f"/{d}"):
            os.mkdir(d)
            bind_ro(f"/{d}", d)
    bind_ro("/usr", "usr", MS_NOSUID | MS_NODEV)
    nosuid = MS_NOSUID | MS_NODEV
    mount("oa-work", "work", "tmpfs", nosuid, f"{size},mode=700,uid={uid},gid={uid}")
    with open(os.path.join(cfg["stage"], "main.py"), "rb") as src:
        code = src.read()
    with open("work/main.py", "wb") as dst:
        dst.write(code)
    os.chown("work/main.py", uid, uid)
    mount("oa-tmp", "tmp", "tmpfs", nosuid, f"{size},mode=1777")
    mount("oa-dev", "dev", "tmpfs", nosuid | MS_NOEXEC, "size=64k,mode=755")
    os.mkdir("dev/shm")
    mount("oa-shm", "dev/shm", "tmpfs", nosuid | MS_NOEXEC, f"{size},mode=1777")
    for name in DEVICES:
        open(f"dev/{name}", "w").close()
        mount(f"/dev/{name}", f"dev/{name}", flags=MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "fd/0"),
        ("stdout", "fd/1"),
        ("stderr", "fd/2"),
    ):
        os.symlink(target, f"dev/{name}")
    mount("proc", "proc", "proc", nosuid | MS_NOEXEC)
    mount(None, "dev", flags=MS_REMOUNT | MS_RDONLY | nosuid | MS_NOEXEC)
    # pivot_root(".", "."): the old root ends up on top of the new one; detach it
    check(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    mount(None, "/", flags=MS_REMOUNT | MS_RDONLY, data="size=1m")
    os.chdir("/work")


def load_seccomp(rules):
    """Rules: (errno, syscall, arg0 test, a, b); test 0 = always, 4 ==, 5 >=, 7 masked ==."""

    class Cmp(ctypes.Structure):
        _fields_ = [
            ("arg", ctypes.c_uint),
            ("op", ctypes.c_int),
            ("a", ctypes.c_uint64),
            ("b", ctypes.c_uint64),
        ]

    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(Cmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SECCOMP_ALLOW)
    for errno, name, op, a, b in rules:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        cmp = (Cmp * 1)(Cmp(0, op, a, b))
        if lib.seccomp_rule_add_array(ctx, SECCOMP_ERRNO | errno, nr, int(op > 0), cmp):
            raise OSError(f"sandbox setup: seccomp rule for {name} refused")
    if lib.seccomp_load(ctx):
        raise OSError("sandbox setup: seccomp filter did not load")


def become_child(cfg):
    """Drop to the run's uid, forbid privilege gain, filter syscalls; main.py, compiled."""
    uid = cfg["uid"]
    if cfg["drop_uid"]:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")  # /proc/self as usual
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if cfg["seccomp"]:
        load_seccomp(cfg["seccomp_rules"])
    os.chdir(cfg["workdir"])
    os.environ.pop("PWD", None)  # a shell set it to a host path
    if cfg["block_net"]:  # the weak fallback without a network namespace
        sys.modules.update(dict.fromkeys(("socket", "_socket", "ssl", "_ssl")))
    sys.argv[:] = ["main.py"]
    with open("main.py", encoding="utf-8") as f:
        return compile(f.read(), "main.py", "exec")


def serve_as_init(child):
    """Reap everything until `child` exits; exit with its status (128 + N for signal N)."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def launch(cfg):
    """Set up, then (in the run's process) return main.py compiled; never returns as init."""
    if cfg["private_fs"]:
        build_root(cfg)
    if cfg["init"]:
        child = os.fork()
        if child != 0:
            serve_as_init(child)
    return become_child(cfg)

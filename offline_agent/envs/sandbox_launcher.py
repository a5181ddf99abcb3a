"""The sandbox's in-child launcher: a standalone script (stdlib only, no project imports).

sandbox.py runs it as `python -S -B -c <this file's text> <json config>` inside the new
namespaces, as root where the parent is root. One interpreter does what would otherwise take
some twenty short-lived tools: build the private root (mounts, pivot_root), stay as the pid
namespace's init (reaping orphans, reporting a signal death as 128 + N like a shell), and in
a forked child drop to the run's uid, set no_new_privs, load the seccomp filter and exec the
user's interpreter. Nothing here runs user code.
"""

import ctypes
import json
import os
import platform
import sys
import traceback

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
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
    check(libc.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
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
    """Drop to the run's uid, forbid privilege gain, filter syscalls, exec the interpreter."""
    uid = cfg["uid"]
    if cfg["drop_uid"]:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if cfg["seccomp"]:
        load_seccomp(cfg["seccomp_rules"])
    env = {k: v for k, v in os.environ.items() if k != "PWD"}  # a shell set it: host path
    os.execve(cfg["argv"][0], cfg["argv"], env)


def serve_as_init(child):
    """Reap everything until `child` exits; exit with its status (128 + N for signal N)."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def main():
    cfg = json.loads(sys.argv[1])
    if cfg["private_fs"]:
        build_root(cfg)
    if not cfg["init"]:
        become_child(cfg)
    child = os.fork()
    if child == 0:
        try:
            become_child(cfg)
        except BaseException:
            traceback.print_exc()
        os._exit(125)
    serve_as_init(child)


main()

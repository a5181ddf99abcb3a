"""Total memory and process caps for one sandbox run: a throwaway cgroup per run.

Each run's cgroup is created under the caller's own cgroup (never at the root of a
hierarchy), so a run can never escape a limit the caller itself is under. cgroup v2 is used
where the caller's cgroup delegates the memory and pids controllers; otherwise the v1
memory and pids hierarchies (this machine: v1 memory/pids, v2 with only hugetlb).
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
PREFIX = "oa-sandbox-"
_names = itertools.count()


@dataclass(frozen=True)
class Cgroups:
    """Where the runs' cgroups go; v2 has one parent for both controllers."""

    version: int  # 1 or 2
    memory_parent: str
    pids_parent: str

    def describe(self) -> str:
        return f"cgroup v{self.version} (memory + pids) under {self.memory_parent}"


def find_parents(mountinfo: str, self_cgroup: str) -> dict[str, str]:
    """The caller's cgroup directory per controller ("memory", "pids") and for "unified" (v2).

    `mountinfo` is /proc/self/mountinfo, `self_cgroup` is /proc/self/cgroup. Pure.
    """
    own = {}  # controller -> path inside its hierarchy
    for line in self_cgroup.splitlines():
        hid, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else ["unified"]:
            own[c] = path
    found = {}
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        fields, fs = pre.split(), post.split()
        if len(fields) < 5 or len(fs) < 3:
            continue
        root, mount = fields[3], fields[4]
        kinds = ["unified"] if fs[0] == "cgroup2" else fs[2].split(",") if fs[0] == "cgroup" else []
        for kind in kinds:
            path = own.get(kind)
            if kind in ("memory", "pids", "unified") and path is not None:
                rel = os.path.relpath(path, root)
                if not rel.startswith(".."):
                    found[kind] = os.path.normpath(os.path.join(mount, rel))
    return found


def probe_cgroups() -> Cgroups | None:
    """A writable cgroup setup with memory and pids limits, or None (stale runs removed)."""
    try:
        parents = find_parents(
            Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
        )
    except OSError:
        return None
    candidates = []
    unified = parents.get("unified")
    if unified and _delegates(unified):
        candidates.append(Cgroups(2, unified, unified))
    if "memory" in parents and "pids" in parents:
        candidates.append(Cgroups(1, parents["memory"], parents["pids"]))
    for cg in candidates:
        _remove_stale(cg)
        try:
            remove(create(cg, memory_mb=64, max_procs=8))
            return cg
        except OSError:
            continue
    return None


def _delegates(path: str) -> bool:
    try:
        enabled = Path(path, "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
    return {"memory", "pids"} <= set(enabled)


def _dirs(cg: Cgroups, name: str) -> list[Path]:
    return list(dict.fromkeys([Path(cg.memory_parent, name), Path(cg.pids_parent, name)]))


def create(cg: Cgroups, memory_mb: int, max_procs: int) -> list[Path]:
    """A fresh cgroup with the caps; returns its directories (the memory one first)."""
    dirs = _dirs(cg, f"{PREFIX}{os.getpid()}-{next(_names)}")
    limit = str(memory_mb * 2**20)
    if cg.version == 2:
        files = [("memory.max", limit), ("memory.swap.max", "0"), ("pids.max", str(max_procs))]
    else:  # memsw (memory + swap) must be set after the plain limit
        files = [
            ("memory.limit_in_bytes", limit),
            ("memory.memsw.limit_in_bytes", limit),
            ("pids.max", str(max_procs)),
        ]
    made = []
    try:
        for d in dirs:
            d.mkdir()
            made.append(d)
        for name, value in files:
            target = next((d / name for d in dirs if (d / name).exists()), None)
            if target is None and name.startswith(("memory.swap", "memory.memsw")):
                continue  # no swap accounting on this kernel: nothing to cap
            if target is None:
                raise OSError(f"cgroup file {name} missing under {dirs}")
            target.write_text(value)
    except OSError:
        remove(made)
        raise
    return dirs


def oom_kills(dirs: list[Path]) -> int:
    """How many processes the kernel killed for exceeding this cgroup's memory cap."""
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        f = dirs[0] / name
        if f.exists():
            fields = dict(ln.split() for ln in f.read_text().splitlines() if len(ln.split()) == 2)
            return int(fields.get("oom_kill", 0))
    return 0


def remove(dirs: list[Path], wait_s: float = 2.0) -> None:
    """Kill whatever is still inside, then delete the cgroup (it must be empty first).

    A cgroup that will not empty in time is left (and logged); the next process's probe
    removes it once its owner has exited."""
    deadline = time.monotonic() + wait_s
    for d in dirs:
        while d.exists():
            for pid in _members(d):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                d.rmdir()
            except OSError as e:
                if time.monotonic() > deadline:
                    log.warning("sandbox cgroup %s left behind: %s", d, e)
                    break
                time.sleep(0.01)


def _members(d: Path) -> list[int]:
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _remove_stale(cg: Cgroups) -> None:
    """Cgroups left by a process that died mid-run (same prefix, owner pid gone)."""
    for parent in {cg.memory_parent, cg.pids_parent}:
        for d in Path(parent).glob(f"{PREFIX}*-*"):
            pid = d.name[len(PREFIX) :].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                remove([d], wait_s=0.5)

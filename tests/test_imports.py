"""The house rules of imports, read from the source with `ast` (nothing is imported):
no import cycle inside the project's packages, `offline_agent` never imports `pipelines`,
`storage` imports only `offline_agent.types` (and itself).

Every import statement counts, at module level or inside a function: an import deferred into
a function still makes the two modules depend on each other, and only hides the cycle until
that function runs. An import of `a.b.c` is an edge to `a.b.c` and to the packages `a`, `a.b`
whose `__init__` Python runs first (a stage module importing `pipelines.stages.eval` runs
`pipelines/stages/__init__.py`, which imports every stage), except the importer's own
packages: those are always initialised before the importer runs, so an `__init__` that
re-exports its submodules is no cycle with them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("offline_agent", "pipelines", "storage")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported project module
    where: str  # file:line of the import statement
    implicit: bool = False  # a package whose __init__ runs first, not the module named


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name `from <node.module>` refers to, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """The project modules `module` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            # `from pkg import sub` imports the module pkg.sub; `from mod import name` mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        else:
            continue
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        targets = {name: False for name in names}
        for name in names:
            targets.update({p: targets.get(p, True) for p in _packages_run_first(module, name)})
        edges += [Edge(module, t, where, implicit) for t, implicit in targets.items()
                  if t.split(".")[0] in PACKAGES]
    return edges


def _packages_run_first(importer: str, name: str) -> list[str]:
    """The packages whose `__init__` importing `name` runs, less the importer's own."""
    parts = name.split(".")
    own = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p not in own]


def import_graph() -> dict[str, list[Edge]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for edge in graph.get(v, []):
            w = edge.target
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or any(e.target == v for e in graph.get(v, [])):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycle_path(graph: dict[str, list[Edge]], component: list[str]) -> list[Edge]:
    """One cycle through the first module of `component`, as the import statements that
    make it (breadth-first, so the shortest such cycle)."""
    start, members = component[0], set(component)
    previous: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for edge in graph[v]:
                if edge.target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, previous[path[0].source])
                    return path
                if edge.target in members and edge.target not in previous:
                    previous[edge.target] = edge
                    nxt.append(edge.target)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def describe(path: list[Edge]) -> str:
    return "\n".join(f"  {e.source} -> {e.target}  ({e.where})" for e in path)


def test_the_graph_sees_every_kind_of_import():
    """The reader must see what a cycle is made of, or the test below could not fail."""
    graph = import_graph()
    targets = {e.target for e in graph["pipelines.cli"]}
    assert "offline_agent.envs.base" in targets  # module level
    assert "offline_agent.envs.testing.check" in targets  # inside a function
    assert any(e.target == "offline_agent.envs.testing" and e.implicit  # its __init__ runs
               for e in graph["pipelines.cli"])
    assert "offline_agent.policy.base" in {e.target for e in graph["offline_agent.policy"]}
    minishop = {e.target for e in graph["offline_agent.envs.minishop.env"]}
    assert "offline_agent.envs.minishop.catalog" in minishop  # its own package: no edge
    assert not {"offline_agent", "offline_agent.envs", "offline_agent.envs.minishop"} & minishop


def test_the_cycle_finder_finds_and_shows_a_cycle():
    graph = {
        "a": [Edge("a", "b", "a.py:1")],
        "b": [Edge("b", "c", "b.py:2"), Edge("b", "d", "b.py:3")],
        "c": [Edge("c", "a", "c.py:9")],
        "d": [],
    }
    (component,) = strongly_connected(graph)
    assert component == ["a", "b", "c"]
    assert [e.where for e in cycle_path(graph, component)] == ["a.py:1", "b.py:2", "c.py:9"]
    assert strongly_connected({"a": [Edge("a", "a", "a.py:1")]}) == [["a"]]
    assert strongly_connected({"a": [Edge("a", "b", "a.py:1")], "b": []}) == []


def test_no_import_cycles():
    graph = import_graph()
    cycles = [cycle_path(graph, c) for c in strongly_connected(graph)]
    assert not cycles, "import cycles:\n" + "\n\n".join(describe(p) for p in cycles)


def test_offline_agent_never_imports_pipelines():
    bad = [e for m, edges in import_graph().items() if m.split(".")[0] == "offline_agent"
           for e in edges if e.target.split(".")[0] == "pipelines"]
    assert not bad, "offline_agent imports pipelines:\n" + describe(bad)


def test_storage_imports_only_offline_agent_types():
    """(and the package `offline_agent`, whose __init__ importing offline_agent.types runs)"""
    bad = [e for m, edges in import_graph().items() if m.split(".")[0] == "storage"
           for e in edges if not e.implicit
           and e.target.split(".")[0] != "storage" and e.target != "offline_agent.types"]
    assert not bad, "storage imports more than offline_agent.types:\n" + describe(bad)


def package_of(module: str) -> str:
    """The package a module counts in for the loop test below: `offline_agent.<sub>` (or the
    top-level module), except the env conformance kit, `offline_agent.envs.testing`, which drives
    an env with a tiny policy (`offline-agent check-env`): it sits above envs, policy and rollout,
    and lives under envs/ where env authors look for it."""
    kit = "offline_agent.envs.testing"
    if module == kit or module.startswith(kit + "."):
        return kit
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "offline_agent" else parts[0]


def test_no_import_loops_between_packages():
    """Modules may form no cycle, and neither may packages: `offline_agent.policy` importing
    `offline_agent.envs` while `offline_agent.envs` imports `offline_agent.policy` makes neither
    usable without the other, even when no two modules import each other."""
    graph: dict[str, list[Edge]] = {}
    for module, edges in import_graph().items():
        graph.setdefault(package_of(module), [])
        graph[package_of(module)] += [Edge(package_of(module), package_of(e.target), e.where)
                                      for e in edges if not e.implicit
                                      and package_of(e.target) != package_of(module)]
    loops = [cycle_path(graph, c) for c in strongly_connected(graph)]
    assert not loops, "packages import each other:\n" + "\n\n".join(describe(p) for p in loops)


def test_the_policy_package_never_imports_envs():
    """The tool-call forms both need are offline_agent/call_forms.py's, so a policy is built
    without any env, and the conformance kit (envs/testing) can drive a policy."""
    bad = [e for m, edges in import_graph().items() if m.startswith("offline_agent.policy")
           for e in edges if e.target.startswith("offline_agent.envs")]
    assert not bad, "offline_agent.policy imports envs:\n" + describe(bad)


STAGES_PACKAGE = "pipelines.stages"


def test_no_stage_module_imports_another():
    """A stage reads what earlier stages stored through pipelines/artifacts.py (and what it
    writes for later ones goes by that module's keys), never through another stage's module,
    directly or through a module it imports: a walk from the CLI into one stage and back
    never crosses into another. The package's `__init__`, which lists the pipeline, is the
    one module that names every stage."""
    graph = import_graph()
    stage_modules = {m for m in graph if m.startswith(STAGES_PACKAGE + ".")}
    assert {"pipelines.stages.search", "pipelines.stages.train"} <= stage_modules
    crossings = []
    for stage in sorted(stage_modules):
        path: dict[str, Edge] = {}  # module reached -> the import that reached it first
        frontier = [stage]
        while frontier:
            edges = [e for m in frontier for e in graph.get(m, [])
                     if e.target not in path and e.target != stage]
            for e in edges:
                path.setdefault(e.target, e)
            frontier = [e.target for e in edges if e.target not in stage_modules
                        and e.target != STAGES_PACKAGE]
        for other in sorted(t for t in path if t in stage_modules or t == STAGES_PACKAGE):
            chain = [path[other]]
            while chain[0].source != stage:
                chain.insert(0, path[chain[0].source])
            crossings.append(chain)
    assert not crossings, "stage modules reach other stages:\n" + "\n\n".join(
        describe(c) for c in crossings)

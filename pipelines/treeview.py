"""Pictures of a search tree: GraphML for Gephi/yEd, and a self-contained HTML page.

Input is the node rows of one tree as the store returns them (storage.NodeRow). The HTML
page needs no network: the layout is computed here and drawn as inline SVG; clicking a node shows its action and observation.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import networkx as nx

from storage import NodeRow


def tree_path(run_dir: Path, task_id: str, fmt: str, r: int = 1) -> Path:
    """RUN_DIR/trees/<task id>.<fmt> (<task id>@<r>.<fmt> for round r >= 2 of run.iterations),
    the id made a plain file name: ids come from the env or a merged shard, and one such as
    `../../x` must not write outside trees/."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)[:200].lstrip(".") or "_"
    return run_dir / "trees" / (f"{name}.{fmt}" if r == 1 else f"{name}@{r}.{fmt}")


def to_graph(nodes: list[NodeRow]) -> nx.DiGraph:
    g = nx.DiGraph()
    for n in nodes:
        visits = int(n.visits or 0)
        attrs = {
            "depth": int(n.depth),
            "action": n.action or "",
            "observation": n.observation or "",
            "visits": visits,
            "q": float(n.value_sum or 0.0) / visits if visits else 0.0,
            "critic_rank": -1 if n.critic_rank is None else int(n.critic_rank),
            "critic_score": -1.0 if n.critic_score is None else float(n.critic_score),
            "ending": -1.0 if n.ending is None else float(n.ending),
            "reward": float(n.reward or 0.0),
            "terminal": bool(n.terminal),
            "invalid": bool(n.invalid),
        }
        g.add_node(str(n.node_id), **attrs)
        if n.parent_id is not None:
            g.add_edge(str(n.parent_id), str(n.node_id))
    return g


def write_graphml(nodes: list[NodeRow], path: Path) -> None:
    nx.write_graphml(to_graph(nodes), path)


def layout(g: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Tidy tree: leaves take consecutive columns, parents sit above their children's middle."""
    roots = [n for n in g if g.in_degree(n) == 0]
    pos: dict[str, tuple[float, float]] = {}
    next_x = 0.0

    def place(n: str) -> float:
        nonlocal next_x
        kids = sorted(g.successors(n), key=lambda k: (g.nodes[k]["critic_rank"], k))
        if not kids:
            x = next_x
            next_x += 1
        else:
            xs = [place(k) for k in kids]
            x = (xs[0] + xs[-1]) / 2
        pos[n] = (x, float(g.nodes[n]["depth"]))
        return x

    for r in roots:
        place(r)
    return pos


def render_html(nodes: list[NodeRow], title: str) -> str:
    g = to_graph(nodes)
    pos = layout(g)
    dx, dy, pad = 46, 80, 30
    width = int(max((x for x, _ in pos.values()), default=0) * dx + 2 * pad)
    height = int(max((y for _, y in pos.values()), default=0) * dy + 2 * pad)
    max_visits = max((g.nodes[n]["visits"] for n in g), default=1) or 1
    svg = []
    for a, b in g.edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        svg.append(f'<line x1="{x1*dx+pad}" y1="{y1*dy+pad}" x2="{x2*dx+pad}" y2="{y2*dy+pad}"'
                   f' stroke="#bbb" stroke-width="{1 + 3 * g.nodes[b]["visits"] / max_visits:.1f}"/>')
    data = {}
    for n, (x, y) in pos.items():
        a = g.nodes[n]
        q = max(0.0, min(1.0, a["q"]))
        color = f"hsl({int(120 * q)},70%,45%)" if a["visits"] else "#ccc"
        stroke = "#000" if a["terminal"] and a["reward"] >= 1 else ("#c00" if a["invalid"] else "#fff")
        r = 6 + 10 * (a["visits"] / max_visits) ** 0.5
        svg.append(f'<circle cx="{x*dx+pad}" cy="{y*dy+pad}" r="{r:.1f}" fill="{color}" '
                   f'stroke="{stroke}" stroke-width="2" data-id="{html.escape(n)}"/>')
        svg.append(f'<text x="{x*dx+pad}" y="{y*dy+pad+r+11:.0f}" font-size="9" '
                   f'text-anchor="middle">N{a["visits"]} Q{a["q"]:.2f}</text>')
        data[n] = a
    payload = json.dumps(data).replace("</", "<\\/")
    return _PAGE.format(
        title=html.escape(title), width=max(width, 200), height=max(height, 120),
        svg="\n".join(svg), data=payload, count=len(data),
    )


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }}
#tree {{ flex: 1; overflow: auto; border-right: 1px solid #ddd; }}
#side {{ width: 34%; padding: 12px; overflow: auto; font-size: 13px; }}
pre {{ white-space: pre-wrap; background: #f6f6f6; padding: 8px; }}
circle {{ cursor: pointer; }} circle.sel {{ stroke: #06f; stroke-width: 4; }}
.legend {{ color: #555; font-size: 12px; }}
</style></head><body>
<div id="tree"><svg width="{width}" height="{height}">{svg}</svg></div>
<div id="side"><h3>{title}</h3>
<p class="legend">{count} nodes. Colour: Q (red 0 to green 1, grey unvisited); size and edge width:
visits; black ring: success; red ring: invalid action. Click a node.</p><div id="info"></div></div>
<script>
const DATA = {data};
const esc = s => String(s).replace(/[&<>]/g, c => ({{'&':'&amp;','<':'&lt;','>':'&gt;'}}[c]));
document.querySelectorAll('circle').forEach(c => c.addEventListener('click', () => {{
  document.querySelectorAll('circle.sel').forEach(e => e.classList.remove('sel'));
  c.classList.add('sel');
  const d = DATA[c.dataset.id];
  document.getElementById('info').innerHTML =
    `<b>node ${{esc(c.dataset.id)}}</b> depth ${{d.depth}} · visits ${{d.visits}} · Q ${{d.q.toFixed(3)}}` +
    ` · critic rank ${{d.critic_rank}} score ${{d.critic_score.toFixed(3)}} · reward ${{d.reward}}` +
    (d.ending >= 0 ? ` · best ending one step on ${{d.ending}}` : '') +
    (d.terminal ? ' · terminal' : '') + (d.invalid ? ' · invalid' : '') +
    `<h4>Action</h4><pre>${{esc(d.action)}}</pre><h4>Observation</h4><pre>${{esc(d.observation)}}</pre>`;
}}));
</script></body></html>
"""

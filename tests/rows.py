"""The one helper tests build stored node rows with."""

from __future__ import annotations

from storage import NodeRow, make_node_id


def node_row(tree: int, local: int, parent: int | None = None, **fields) -> NodeRow:
    """Node `local` of tree `tree` under local node `parent` (None: the root); depth 0 at the
    root and 1 below unless given; any other NodeRow field by keyword."""
    fields.setdefault("depth", 0 if parent is None else 1)
    return NodeRow(node_id=make_node_id(tree, local), tree_id=tree,
                   parent_id=None if parent is None else make_node_id(tree, parent), **fields)

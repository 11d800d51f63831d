"""The HTML page's sentences count in words that agree with the count: ``1 node``, ``1 value``."""

from __future__ import annotations

import re

from passkit.artifacts.html_page import ProgramHistory, StepEntry, render


def _page(saved: int, recomputed: int, nodes: int) -> str:
    split = {
        "forward_nodes": nodes, "backward_nodes": nodes,
        "saved": [{"name": f"s{i}", "shape": [4], "dtype": "float32", "bytes": 16} for i in range(saved)],
        "saved_bytes": 16 * saved,
        "recomputed": [{"name": f"r{i}", "op": "aten.mul.Tensor", "from": ["s0"]} for i in range(recomputed)],
    }
    history = ProgramHistory("graph 1, training", "p.toml", True, [StepEntry(0, "captured", "", nodes={"main": nodes})], split)
    return re.sub(r"<[^>]+>", "|", render([history]))


def test_one_of_a_thing_is_singular() -> None:
    page = _page(saved=1, recomputed=1, nodes=1)
    assert "1 value saved (16 B); 1 node of the backward is computed from saved values only" in page
    assert "|1 node|" in page and "saved for the backward: 1 value, 16 B" in page
    assert not re.search(r"\b1 (nodes|values)\b", page)


def test_more_are_plural() -> None:
    page = _page(saved=2, recomputed=3, nodes=5)
    assert "2 values saved (32 B); 3 nodes of the backward are computed from saved values only" in page
    assert "|5 nodes|" in page and "saved for the backward: 2 values, 32 B" in page

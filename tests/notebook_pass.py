"""A pass as a notebook cell defines it, with no plugin and no file of its own: ``neg(neg(x))``
folded to ``x``. ``tests/cache/test_notebook_pipelines.py`` writes this text into a notebook
(the compile cache follows the pass's code); ``tests/frontends/test_dict_pipelines.py`` imports it."""

import torch

import passkit

aten = torch.ops.aten


@passkit.graph_pass("nb.fold_double_neg", requires={"functional"})
def fold_double_neg(program: passkit.Program, *, max_rewrites: int = 100) -> bool:
    """Rewrite neg(neg(x)) to x."""
    rewrites = 0
    for gm in program.graphs.values():
        for node in list(gm.graph.nodes):
            inner = node.args[0] if node.target is aten.neg.default else None
            if rewrites >= max_rewrites or getattr(inner, "target", None) is not aten.neg.default:
                continue
            node.replace_all_uses_with(inner.args[0])
            gm.graph.erase_node(node)
            if not inner.users:
                gm.graph.erase_node(inner)
            rewrites += 1
        gm.recompile()
    program.record_stat("rewrites", rewrites)
    return rewrites > 0

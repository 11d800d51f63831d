"""functionalize: no mutating op remains; the signature records what was mutated and how."""

from __future__ import annotations

import torch

from passkit.frontends.capture import program_from_function
from passkit.core.facts import failed_checks
from passkit.passes.functionalize import functionalize
from passkit.core.registry import get_registry


def test_mutations_become_outputs_and_signature_records() -> None:
    def fn(w, x, stats, y):
        with torch.no_grad():
            w.mul_(2)
        stats.add_(x.sum())
        y.t_()
        return x * w, x.view(-1)

    program = program_from_function(
        fn, [torch.randn(3, requires_grad=True), torch.randn(2, 3), torch.zeros(()), torch.randn(2, 3)]
    )
    assert program.signature.outputs[1].alias_of_input == 1
    facts = get_registry().facts
    assert [fact for fact, _ in failed_checks(program, {"functional"}, facts)] == ["functional"]
    assert functionalize(program) is True
    assert failed_checks(program, {"functional"}, facts) == []
    infos = program.signature.inputs
    assert (infos[0].mutates_data, infos[0].mutated_under_no_grad) == (True, True)
    assert (infos[1].mutates_data, infos[1].mutates_metadata) == (False, False)
    assert (infos[2].mutates_data, infos[2].mutated_under_no_grad) == (True, False)
    assert (infos[3].mutates_data, infos[3].mutates_metadata) == (False, True)
    assert [str(d) for d in program.io("main").outputs] == ["mutation[0]", "mutation[2]", "mutation[3]", "user[0]", "user[1]"]


def test_batchnorm_running_stats_become_outputs() -> None:
    bn = torch.nn.BatchNorm1d(3)
    program = program_from_function(
        lambda x, mean, var, w, b: torch.nn.functional.batch_norm(x, mean, var, w, b, training=True),
        [torch.randn(4, 3), bn.running_mean, bn.running_var, bn.weight, bn.bias],
    )
    functionalize(program)
    targets = {str(n.target) for n in program.graphs["main"].graph.nodes}
    assert "aten._native_batch_norm_legit_functional.default" in targets
    assert [d.kind for d in program.io("main").outputs] == ["mutation", "mutation", "user"]

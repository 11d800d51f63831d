"""A program loaded from the compile cache computes what the freshly compiled one did.

Graphs used to be stored as pickled code, and unpickling re-traced it: a random op on no traced
value ran once and stayed as a constant, and every node lost the value that tells the runtime
which saved tensors share a mutated input's storage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import passkit


def _compile_twice(fn, monkeypatch, tmp_path):  # noqa: ANN001, ANN202
    """The fresh compile of ``fn`` and a second one that may come from the cache the first filled."""
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "cache"))
    return passkit.aot_function(fn, pipeline="training-python"), passkit.aot_function(fn, pipeline="training-python")


def test_a_channel_dropout_from_the_cache_draws_what_eager_draws(monkeypatch, tmp_path) -> None:
    # dropout2d draws its mask on a tensor of its own ((N, C, 1, 1), not made from the input)
    fn = lambda x: F.dropout2d(x, 0.5, training=True)  # noqa: E731
    x = torch.randn(4, 8, 3, 3, requires_grad=True)
    for compiled in _compile_twice(fn, monkeypatch, tmp_path):
        for seed in (1, 2):
            torch.manual_seed(seed)
            expected = fn(x)
            torch.manual_seed(seed)
            torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)


def test_batch_norm_saving_its_running_stats_runs_from_the_cache(monkeypatch, tmp_path) -> None:
    def fn(x, w, b, mean, var):  # noqa: ANN001, ANN202
        return torch.native_batch_norm(x, w, b, mean, var, True, 0.5, 1e-5)[0]

    def run(f):  # noqa: ANN001, ANN202
        x, w, b = (torch.randn(*s, generator=torch.Generator().manual_seed(i)).requires_grad_() for i, s in enumerate([(2, 1), (1,), (1,)]))
        mean, var = torch.zeros(1), torch.ones(1)
        out = f(x, w, b, mean, var)
        return out, torch.autograd.grad(out.sum().abs() + out.square().sum(), (x, w, b)), mean, var

    expected = run(fn)
    for compiled in _compile_twice(fn, monkeypatch, tmp_path):
        torch.testing.assert_close(run(compiled), expected)

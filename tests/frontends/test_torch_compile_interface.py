"""torch.compile's own interface: mode, options, errors at creation, one-line errors, reports()."""

from __future__ import annotations

import warnings

import pytest
import torch

import passkit


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def _sin2(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_every_torch_compile_mode_is_accepted(mode: str) -> None:
    compiled = torch.compile(_sin2, backend="passkit", mode=mode)
    before = len(passkit.reports())
    x = torch.randn(4, requires_grad=True)
    torch.testing.assert_close(compiled(x), _sin2(x))
    assert len(passkit.reports()) == before + 1


def test_mode_reaches_a_codegen_pass_that_takes_it() -> None:
    from passkit.frontends.compile_options import apply_mode

    backend = passkit.backend("training")
    tuned = backend.pipeline_for(mode="max-autotune")  # what torch.compile(mode=...) hands the backend
    codegen = tuned.step("codegen.inductor").options
    assert (codegen.mode, backend.pipeline.step("codegen.inductor").options.mode) == ("max-autotune", "default")
    assert codegen.config_patches()["max_autotune"] is True  # the Inductor settings torch's mode sets
    untouched = [step.options for step in tuned.steps if step.id != "codegen.inductor"]
    assert untouched == [step.options for step in backend.pipeline.steps if step.id != "codegen.inductor"]
    base = passkit.load_pipeline("training-python")
    assert apply_mode(base, "max-autotune") == base  # codegen.python has nothing to tune
    with pytest.raises(passkit.PasskitError) as info:
        apply_mode(base, "fastest")
    assert str(info.value) == (
        "passkit: torch.compile mode 'fastest' is not one of default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"
    )


def test_options_choose_the_pipeline_and_settings(tmp_path) -> None:
    compiled = torch.compile(
        _sin2,
        backend="passkit",
        options={"pipeline": "training-python", "dump": "changed", "dump_dir": str(tmp_path / "d"), "verify": "facts"},
    )
    x = torch.randn(4, requires_grad=True)
    torch.testing.assert_close(compiled(x), _sin2(x))
    report = passkit.reports()[-1]
    assert report.pipeline == "training-python"
    assert any(p.name.endswith("-codegen.python-forward.py") for p in (tmp_path / "d").rglob("*.py"))


def test_an_unknown_option_is_a_one_line_passkit_error() -> None:
    compiled = torch.compile(_sin2, backend="passkit", options={"pipline": "training"})
    with pytest.raises(passkit.PasskitError) as info:
        compiled(torch.randn(4))
    assert str(info.value) == (
        "passkit: torch.compile options: unknown key 'pipline' "
        "(keys: pipeline, verify, dump, dump_dir, on_error, repro_dir, report, rtol, atol, cache, cache_wait)"
    )


def test_a_compile_failure_reaches_the_user_as_passkits_one_line_error(tmp_path) -> None:
    path = tmp_path / "no-codegen.toml"
    path.write_text('[pipeline]\nname = "x"\nextends = "training-python"\ndisable = ["codegen.python"]\n')
    with pytest.raises(passkit.PipelineError) as info:
        torch.compile(_sin2, backend="passkit", options={"pipeline": str(path)})(torch.randn(3))
    assert type(info.value) is passkit.PipelineError
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}: no step produces fact 'compiled'")


def test_backend_validates_its_pipeline_when_created(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[steps]]\npass = "fx.dcee"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.backend(str(path))
    assert str(info.value) == f"{path}: steps[0]: unknown pass 'fx.dcee'; did you mean 'fx.dce'?"


def test_reports_returns_every_compile_newest_last() -> None:
    first = passkit.compile(_sin2, dynamic=False)
    first(torch.randn(3))
    second = torch.compile(lambda x: x.cos(), backend="passkit", dynamic=False)
    second(torch.randn(3))
    reports = passkit.reports()
    assert reports[-2] is first.passkit_reports[0]
    assert reports[-1].graph != "" and reports[-1] is not reports[-2]


def test_hitting_dynamos_recompile_limit_warns_once_naming_the_function() -> None:
    def varying(x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k

    compiled = torch.compile(varying, backend="passkit", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(5):
            torch.testing.assert_close(compiled(torch.ones(2), k), torch.ones(2) * k)
    ours = [str(w.message) for w in caught if str(w.message).startswith("passkit:")]
    assert len(ours) == 1
    assert ours[0].startswith("passkit: torch.compile hit torch._dynamo.config.recompile_limit (2) for 'varying' (")
    assert ours[0].endswith("from now on it runs eagerly, uncompiled (raise the limit, or let the changing sizes be dynamic)")

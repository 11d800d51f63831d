"""One ``--model`` factory contract for ``passkit run``, ``bisect`` and ``export``
(``passkit.frontends.check.ModelExample``): ``(module, example_inputs)`` where the inputs are
positional arguments, a lone tensor, or a lone dict of keyword arguments."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from passkit.cli import main

pytestmark = pytest.mark.slow

MODELS = textwrap.dedent(
    '''
    import torch

    class TinyLM(torch.nn.Module):
        """Keyword arguments, as a Hugging Face model takes them."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 8)
            self.head = torch.nn.Linear(8, 16)

        def forward(self, input_ids, attention_mask=None):
            hidden = self.embed(input_ids)
            if attention_mask is not None:
                hidden = hidden * attention_mask.unsqueeze(-1)
            return self.head(hidden)

    def _inputs():
        torch.manual_seed(0)
        return TinyLM(), torch.randint(0, 16, (2, 5)), torch.ones(2, 5)

    def lone_dict():
        model, ids, mask = _inputs()
        return model, {"input_ids": ids, "attention_mask": mask}

    def dict_in_tuple():
        model, ids, mask = _inputs()
        return model, ({"input_ids": ids, "attention_mask": mask},)

    def positional_list():
        model, ids, mask = _inputs()
        return model, [ids, mask]

    def lone_tensor():
        model, ids, _ = _inputs()
        return model, ids

    def not_a_pair():
        return _inputs()
    '''
)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "factory_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
    return tmp_path


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("factory", ["lone_dict", "dict_in_tuple", "positional_list", "lone_tensor"])
def test_run_takes_every_form_of_example_inputs(workdir: Path, factory: str) -> None:
    result = _invoke("run", "training-python", "--model", f"factory_models:{factory}", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert (payload["ok"], payload["training"], payload["outputs_max_diff"]) == (True, True, 0.0)


def test_bisect_and_export_take_the_lone_dict_factory_run_takes(workdir: Path) -> None:
    bisected = _invoke("bisect", "training-python", "--model", "factory_models:lone_dict", "--json")
    assert bisected.exit_code == 0, bisected.output
    assert json.loads(bisected.stdout)["first_bad_step"] is None
    exported = _invoke("export", "export", "--model", "factory_models:lone_dict", "-o", "lm.pt2")
    assert exported.exit_code == 0, exported.output
    import factory_models

    model, inputs = factory_models.lone_dict()
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(workdir / "lm.pt2").module()(**inputs), model(**inputs))


def test_a_factory_that_breaks_the_contract_is_one_line_and_exit_2(workdir: Path) -> None:
    for command in (["run", "training-python"], ["bisect", "training-python"], ["export", "export", "-o", "x.pt2"]):
        result = _invoke(*command, "--model", "factory_models:not_a_pair")
        assert (result.exit_code, result.stderr.splitlines()[-1]) == (
            2, "--model factory_models:not_a_pair: the factory must return (module, example_inputs)"), command

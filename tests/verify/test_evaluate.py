"""Observing a program at any stage draws the same random numbers as the capture did."""

from __future__ import annotations

import dataclasses

import torch

import passkit
from passkit.frontends.capture import program_from_function
from passkit.verify.evaluate import Reference
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry
from passkit.core.runner import run_pipeline


def test_a_functional_training_program_with_dropout_agrees_with_its_capture() -> None:
    inputs = [torch.randn(8, 16), torch.randn(16, 16, requires_grad=True)]
    program = program_from_function(lambda x, w: (torch.nn.functional.dropout(x @ w, 0.5, training=True),), inputs)
    reference = Reference(program, inputs)
    pipeline = passkit.load_pipeline("training-python")
    # Only functionalize: the training program is still one `main` graph, observed through the
    # joint function after a probe run that must not consume the dropout's random numbers.
    run_pipeline(dataclasses.replace(pipeline, steps=pipeline.steps[:1]), program, pm=get_plugin_manager(), registry=get_registry())
    assert program.training and "functional" in program.facts and list(program.graphs) == ["main"]
    assert reference.compare(program) is None


def test_observing_a_program_leaves_every_random_generator_as_it_was() -> None:
    # torch.manual_seed would also queue a reseed of the CUDA generators for when CUDA starts:
    # the user's GPU dropout masks would change after a verified compile.
    inputs = [torch.randn(8, 16)]
    program = program_from_function(lambda x: (torch.nn.functional.dropout(x, 0.5, training=True),), inputs)
    state = torch.get_rng_state()
    queued = list(torch.cuda._lazy_seed_tracker.get_calls())
    Reference(program, inputs)
    assert torch.equal(torch.get_rng_state(), state)
    assert list(torch.cuda._lazy_seed_tracker.get_calls()) == queued

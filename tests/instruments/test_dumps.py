"""The dumps instrument writes graph code per step, as settings.dump asks."""

from __future__ import annotations

from pathlib import Path


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_dump_changed_writes_captured_and_changing_steps_only(kit, program_factory, tmp_path) -> None:
    pipeline = kit.pipeline("test.noop", "test.add_dead", "test.noop", dump="changed", dump_dir=str(tmp_path / "dumps"))
    report = kit.run(pipeline, program_factory())
    out = tmp_path / "dumps" / "graph-1"
    assert _names(out) == ["00-captured-main.py", "02-test.add_dead-main.py"]
    assert report.records[0].dumps == [str(out / "00-captured-main.py")]
    assert report.records[1].dumps == [str(out / "02-test.add_dead-main.py")]
    assert report.records[2].dumps == []


def test_dump_file_holds_a_header_and_the_graph_code(kit, program_factory, tmp_path) -> None:
    program = program_factory()
    pipeline = kit.pipeline("test.add_dead", dump="changed", dump_dir=str(tmp_path))
    kit.run(pipeline, program)
    tmp_path = tmp_path / "graph-1"
    text = (tmp_path / "01-test.add_dead-main.py").read_text()
    assert text.startswith(
        "# passkit dump: step 1 (test.add_dead), pass test.add_dead\n"
        "# graph: main (6 nodes)\n"
        "# facts: captured\n"
    )
    assert text.endswith(program.graphs["main"].code)
    assert "torch.ops.aten.neg.default(x)" in text
    captured = (tmp_path / "00-captured-main.py").read_text()
    assert captured.startswith("# passkit dump: captured program\n")
    assert "neg" not in captured and "torch.ops.aten.add.Tensor(x, y)" in captured


def test_dump_all_writes_every_step_that_ran(kit, program_factory, tmp_path) -> None:
    pipeline = kit.pipeline("test.noop", "test.noop", dump="all", dump_dir=str(tmp_path))
    kit.run(pipeline, program_factory())
    assert _names(tmp_path / "graph-1") == ["00-captured-main.py", "01-test.noop-main.py", "02-test.noop-main.py"]


def test_dump_off_writes_nothing(kit, program_factory, tmp_path) -> None:
    out = tmp_path / "dumps"
    report = kit.run(kit.pipeline("test.add_dead", dump_dir=str(out)), program_factory())
    assert not out.exists()
    assert report.records[0].dumps == []


def test_table_counts_dump_files(kit, program_factory, tmp_path) -> None:
    report = kit.run(kit.pipeline("test.add_dead", dump="changed", dump_dir=str(tmp_path)), program_factory())
    assert report.records[0].remarks() == "dumps=2"


def test_each_program_gets_its_own_folder_and_a_rerun_in_a_new_process_replaces_it(
    kit, program_factory, tmp_path, monkeypatch
) -> None:
    from passkit.instruments import dumps

    pipeline = kit.pipeline("test.add_dead", dump="changed", dump_dir=str(tmp_path))
    kit.run(pipeline, program_factory())
    kit.run(kit.pipeline("test.noop", dump="all", dump_dir=str(tmp_path)), program_factory())
    assert _names(tmp_path) == ["graph-1", "graph-2"]
    assert _names(tmp_path / "graph-1") == ["00-captured-main.py", "01-test.add_dead-main.py"]
    assert _names(tmp_path / "graph-2") == ["00-captured-main.py", "01-test.noop-main.py"]
    monkeypatch.setattr(dumps, "_claimed", {})  # as a new process starts
    kit.run(kit.pipeline("test.noop", dump="changed", dump_dir=str(tmp_path)), program_factory())
    assert _names(tmp_path / "graph-1") == ["00-captured-main.py"]


def test_the_codegen_dump_shows_the_generated_code(program_factory, tmp_path) -> None:
    from passkit.passes import codegen_python
    from tiny_programs import Kit

    kit = Kit(codegen_python)
    report = kit.run(kit.pipeline("codegen.python", dump="changed", dump_dir=str(tmp_path)), program_factory())
    assert report.records[0].changed is False
    text = (tmp_path / "graph-1" / "01-codegen.python-main.py").read_text()
    assert text.startswith("# passkit dump: step 1 (codegen.python), pass codegen.python\n# graph: main (5 nodes), generated code\n")
    # fast_calls: the generated code calls torch.add, where the graph calls torch.ops.aten.add.Tensor.
    assert "torch.add(x, y)" in text and "torch.ops.aten" not in text

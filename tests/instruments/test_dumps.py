"""The dumps instrument writes graph code per step, as settings.dump asks."""

from __future__ import annotations

from pathlib import Path


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_dump_changed_writes_captured_and_changing_steps_only(kit, program_factory, tmp_path) -> None:
    out = tmp_path / "dumps"
    pipeline = kit.pipeline("test.noop", "test.add_dead", "test.noop", dump="changed", dump_dir=str(out))
    report = kit.run(pipeline, program_factory())
    assert _names(out) == ["00-captured-main.py", "02-test.add_dead-main.py"]
    assert report.records[0].dumps == [str(out / "00-captured-main.py")]
    assert report.records[1].dumps == [str(out / "02-test.add_dead-main.py")]
    assert report.records[2].dumps == []


def test_dump_file_holds_a_header_and_the_graph_code(kit, program_factory, tmp_path) -> None:
    program = program_factory()
    pipeline = kit.pipeline("test.add_dead", dump="changed", dump_dir=str(tmp_path))
    kit.run(pipeline, program)
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
    assert _names(tmp_path) == ["00-captured-main.py", "01-test.noop-main.py", "02-test.noop-main.py"]


def test_dump_off_writes_nothing(kit, program_factory, tmp_path) -> None:
    out = tmp_path / "dumps"
    report = kit.run(kit.pipeline("test.add_dead", dump_dir=str(out)), program_factory())
    assert not out.exists()
    assert report.records[0].dumps == []


def test_table_counts_dump_files(kit, program_factory, tmp_path) -> None:
    report = kit.run(kit.pipeline("test.add_dead", dump="changed", dump_dir=str(tmp_path)), program_factory())
    assert report.records[0].remarks() == "dumps=2"

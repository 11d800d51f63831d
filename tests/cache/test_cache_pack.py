"""Signing keys, shipping a warm cache and a team's folder: ``passkit cache keygen`` writes a key
pair (the private half mode 0600); ``pack`` moves a folder's signed entries as one file and
``unpack`` checks each as a load does before writing it (a report then says it came from the
pack); a folder the group can write is used only by a process that trusts keys."""

from __future__ import annotations

import json
import logging
import stat
import tarfile
from pathlib import Path

import torch
from click.testing import CliRunner

import passkit
from passkit.cache import folder as cache_folder
from passkit.cli import main


def _compile():  # noqa: ANN202
    compiled = passkit.aot_function(lambda x: (x * 2.0).sin(), pipeline="training-python")
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(x * 2.0) * 2.0)
    return compiled.passkit_reports[0]


def _keys(folder: Path) -> tuple[Path, Path]:
    CliRunner().invoke(main, ["cache", "keygen", str(folder)])
    return folder / "passkit-cache.key", folder / "passkit-cache.pub"


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites_one(tmp_path) -> None:
    result = CliRunner().invoke(main, ["cache", "keygen", str(tmp_path / "keys")])
    private, public = tmp_path / "keys" / "passkit-cache.key", tmp_path / "keys" / "passkit-cache.pub"
    assert result.stdout.splitlines() == [
        f"private key: {private} (PASSKIT_CACHE_SIGNING_KEY; keep it secret)",
        f"public key: {public} (PASSKIT_CACHE_TRUSTED_KEYS): {public.read_text().strip()}",
    ]
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_text().startswith("ed25519:") and len(public.read_text().strip()) == len("ed25519:") + 44
    again = CliRunner().invoke(main, ["cache", "keygen", str(tmp_path / "keys")])
    assert (again.exit_code, again.stderr) == (2, f"{private} already exists; passkit does not overwrite a key (remove it first)\n")


def test_a_packed_cache_unpacks_into_an_empty_folder_and_loads_from_the_pack(tmp_path, monkeypatch) -> None:
    private, public = _keys(tmp_path / "keys")
    monkeypatch.setenv("PASSKIT_CACHE_SIGNING_KEY", str(private))
    assert _compile().cache == "miss"
    runner = CliRunner()
    packed = json.loads(runner.invoke(main, ["cache", "pack", str(tmp_path / "warm.tar"), "--json"]).stdout)
    assert (packed["entries"], packed["unsigned"]) == (1, 0)
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "image"))
    monkeypatch.delenv("PASSKIT_CACHE_SIGNING_KEY")
    refused = runner.invoke(main, ["cache", "unpack", str(tmp_path / "warm.tar")])
    assert (refused.exit_code, refused.stderr) == (2, "passkit cache unpack writes only entries a trusted key signed; "
                                                      "set PASSKIT_CACHE_TRUSTED_KEYS=FILE[:FILE...]\n")
    monkeypatch.setenv("PASSKIT_CACHE_TRUSTED_KEYS", str(public))
    done = runner.invoke(main, ["cache", "unpack", str(tmp_path / "warm.tar")])
    assert done.stdout == f"unpacked 1 entry into {tmp_path / 'image'}\n"
    report = _compile()
    assert (report.cache, report.source) == ("hit", "pack")


def test_unpack_skips_entries_another_key_signed_or_that_are_not_entries(tmp_path, monkeypatch) -> None:
    private, _ = _keys(tmp_path / "keys")
    _, other = _keys(tmp_path / "other")
    monkeypatch.setenv("PASSKIT_CACHE_SIGNING_KEY", str(private))
    _compile()
    CliRunner().invoke(main, ["cache", "pack", str(tmp_path / "warm.tar")])
    with tarfile.open(tmp_path / "warm.tar", "a") as archive:
        archive.add(private, arcname="../../escape.entry")
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "image"))
    monkeypatch.setenv("PASSKIT_CACHE_TRUSTED_KEYS", str(other))
    done = json.loads(CliRunner().invoke(main, ["cache", "unpack", str(tmp_path / "warm.tar"), "--json"]).stdout)
    assert done["entries"] == 0
    assert len(done["skipped"]) == 2
    assert done["skipped"][0].endswith(f"signed by {(tmp_path / 'keys' / 'passkit-cache.pub').read_text().strip()}, "
                                       "a key this process does not trust")
    assert done["skipped"][1] == "../../escape.entry: not a cache entry"
    assert not (tmp_path / "escape.entry").exists() and list((tmp_path / "image").iterdir()) == []


def test_a_folder_the_group_can_write_is_used_only_with_trusted_keys(tmp_path, monkeypatch, caplog) -> None:
    folder = tmp_path / "team"
    folder.mkdir(mode=0o770)
    folder.chmod(0o770)
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(folder))
    monkeypatch.setattr(cache_folder, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        assert _compile().cache == ""  # the folder refused: not looked up
    assert caplog.messages == [f"passkit: compile cache folder {folder} is writable by others (mode 0770), so passkit "
                               f"does not use it; run chmod 700 {folder}"]
    assert list(folder.iterdir()) == []
    private, public = _keys(tmp_path / "keys")
    monkeypatch.setenv("PASSKIT_CACHE_SIGNING_KEY", str(private))
    monkeypatch.setenv("PASSKIT_CACHE_TRUSTED_KEYS", str(public))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        assert _compile().cache == "miss"
        assert (_compile().cache, _compile().source) == ("hit", "folder")
    assert caplog.messages == []
    (entry,) = folder.glob("*.entry")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o640  # the group reads it
    folder.chmod(0o777)
    assert "refused: " in CliRunner().invoke(main, ["cache", "info"]).stdout  # everyone: still refused

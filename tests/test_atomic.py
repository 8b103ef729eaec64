"""The one atomic writer (`unstable.atomic`): a file or directory is whole in its old version or its new one."""

import json

import pytest

from unstable import atomic


def test_write_text_and_json_replace_the_file_and_leave_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    atomic.write_text(path, "new")
    atomic.write_json(tmp_path / "latest.json", {"step": 3})
    assert path.read_text() == "new"
    assert json.loads((tmp_path / "latest.json").read_text()) == {"step": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "latest.json"]


def test_a_failed_file_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"), atomic.replace_file(path, "wb") as f:
        f.write(b"half")
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_replace_dir_builds_beside_and_replaces_the_old_directory(tmp_path):
    final = tmp_path / "step-2"
    final.mkdir()
    (final / "stale.json").write_text("{}")
    with atomic.replace_dir(final) as building:
        assert building == tmp_path / "step-2.tmp" and not any(building.iterdir())
        (building / "learner.json").write_text("{}")
    assert [p.name for p in final.iterdir()] == ["learner.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["step-2"]


def test_a_failed_directory_write_keeps_the_old_directory(tmp_path):
    final = tmp_path / "checkpoint-1"
    final.mkdir()
    (final / "adapter.safetensors").write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), atomic.replace_dir(final) as building:
        (building / "adapter.safetensors").write_text("half")
        raise RuntimeError("disk full")
    assert (final / "adapter.safetensors").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-1"]


def test_replace_dir_clears_a_leftover_of_a_killed_write(tmp_path):
    (tmp_path / "step-4.tmp").mkdir()
    (tmp_path / "step-4.tmp" / "half.json").write_text("{")
    with atomic.replace_dir(tmp_path / "step-4") as building:
        (building / "whole.json").write_text("{}")
    assert [p.name for p in (tmp_path / "step-4").iterdir()] == ["whole.json"]


def test_a_directory_is_flushed_to_disk_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """Every file of a checkpoint or state, and its directories, reach the disk before the rename (and the rename
    after it), so a power loss cannot leave a pointer to empty files (they were renamed unflushed before)."""
    flushed, fsync = [], atomic.os.fsync

    def recording(descriptor):
        flushed.append(atomic.os.readlink(f"/proc/self/fd/{descriptor}"))
        fsync(descriptor)

    monkeypatch.setattr(atomic.os, "fsync", recording)
    with atomic.replace_dir(tmp_path / "ckpt-1") as building:
        (building / "sub").mkdir()
        (building / "adapter_model.safetensors").write_bytes(b"weights")
        (building / "sub" / "config.json").write_text("{}")
    building = str(tmp_path / "ckpt-1.tmp")
    assert {f"{building}/adapter_model.safetensors", f"{building}/sub/config.json", f"{building}/sub", building} <= set(
        flushed
    )
    assert flushed[-1] == str(tmp_path)  # the rename, after the files


def test_what_kills_left_half_written_or_half_deleted_is_removed_at_resume(tmp_path):
    """A kill between `replace_dir`'s two renames left a hidden `.ckpt-3.old-*` folder that nothing deleted."""
    from unstable.runtime import resume

    for name in ("ckpt-3", ".ckpt-3.old-x1y2", "ckpt-4.tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    (tmp_path / "state" / "step-2.tmp").mkdir(parents=True)
    resume.discard_after(tmp_path, 3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-3"]
    assert not any((tmp_path / "state").iterdir())

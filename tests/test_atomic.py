"""mclib.core.atomic.write_atomic: a file or folder written whole, flushed to the disk before
and after its rename."""

import os

import pytest

from mclib.core import atomic
from mclib.core.atomic import write_atomic


def test_bytes_and_text_are_written_whole(tmp_path):
    write_atomic(tmp_path / "a.bin", b"\x00\x01")
    write_atomic(tmp_path / "b.txt", "rounding: 5.7×\n")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "b.txt").read_bytes() == "rounding: 5.7×\n".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.txt"]  # no temporary left


def test_a_writer_replaces_a_file_and_a_full_folder(tmp_path):
    write_atomic(tmp_path / "f.csv", "old")
    write_atomic(tmp_path / "f.csv", lambda tmp: tmp.write_text("new"))
    assert (tmp_path / "f.csv").read_text() == "new"

    def folder(content):
        def write(tmp):
            (tmp / "sub").mkdir(parents=True)
            (tmp / "sub" / "x").write_text(content)

        return write

    write_atomic(tmp_path / "ck", folder("1"))
    write_atomic(tmp_path / "ck", folder("2"))
    assert (tmp_path / "ck" / "sub" / "x").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "f.csv"]


def test_a_temporary_left_by_a_cut_write_is_replaced(tmp_path):
    (tmp_path / ".tmp-ck").mkdir()
    (tmp_path / ".tmp-ck" / "stale").write_text("cut")
    write_atomic(tmp_path / "ck", lambda tmp: (tmp.mkdir(), (tmp / "fresh").write_text("1")))
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["fresh"]


def test_a_writer_that_writes_nothing_leaves_the_old_file(tmp_path):
    write_atomic(tmp_path / "f", "old")
    with pytest.raises(FileNotFoundError, match="wrote nothing"):
        write_atomic(tmp_path / "f", lambda tmp: None)
    assert (tmp_path / "f").read_text() == "old"


def test_other_data_is_refused_by_its_type(tmp_path):
    with pytest.raises(TypeError, match="not dict"):
        write_atomic(tmp_path / "f", {"a": 1})
    assert not (tmp_path / "f").exists()


def test_the_file_is_flushed_before_its_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        atomic.os,
        "fsync",
        lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1],
    )
    monkeypatch.setattr(
        atomic.os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1]
    )
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("names an fd through /proc")
    write_atomic(tmp_path / "f", lambda tmp: tmp.write_text("x"))
    assert events == [
        ("fsync", str(tmp_path / ".tmp-f")),
        ("replace", str(tmp_path / "f")),
        ("fsync", str(tmp_path)),
    ]

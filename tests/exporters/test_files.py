# SPDX-License-Identifier: Apache-2.0
"""Local pprof files: names, contents, oldest-first clean-up by count and bytes, an unwritable folder, a full disk."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.exporters import FilesProfileExporter
from otel_gpu.exporters.files import profile_file_name
from tests.profiles import batches, pprof_proto
from tests.tmpfs import remount, small_tmpfs


def _batch_at(i: int):  # type: ignore[no-untyped-def]
    return dataclasses.replace(batches.cpu_batch(), start_unix_nano=batches.START_NS + i * batches.DURATION_NS)


def test_writes_gzipped_pprof_named_by_type_and_time(tmp_path: Path) -> None:
    exporter = FilesProfileExporter(str(tmp_path / "out"))
    assert exporter.export(batches.cpu_batch(frequency_hz=100))
    assert exporter.export(batches.gpu_batch())
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["profile-cpu-20251124T160000Z-000001.pb.gz", "profile-gpu_time-20251124T160000Z-000002.pb.gz"]
    profile = pprof_proto.decode((tmp_path / "out" / names[0]).read_bytes())
    assert pprof_proto.stacks(profile)[("hot_loop", "main")] == [30, 300_000_000]
    assert profile_file_name(batches.gpu_batch(), 3).startswith("profile-gpu_time-")


def test_keeps_at_most_max_files_oldest_removed_first(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("not ours\n")
    exporter = FilesProfileExporter(str(tmp_path), max_files=3)
    for i in range(6):
        exporter.export(_batch_at(i))
        newest = max(tmp_path.glob("profile-*.pb.gz"), key=lambda p: p.name)
        os.utime(newest, ns=(i * 10**9, i * 10**9))  # distinct, ordered mtimes whatever the clock resolution
    kept = sorted(p.name for p in tmp_path.glob("profile-*.pb.gz"))
    assert [name.rsplit("-", 1)[1] for name in kept] == ["000004.pb.gz", "000005.pb.gz", "000006.pb.gz"]
    assert (tmp_path / "metrics.jsonl").exists()


def test_keeps_within_max_bytes(tmp_path: Path) -> None:
    size = len(Path(_write_one(tmp_path / "probe")).read_bytes())
    exporter = FilesProfileExporter(str(tmp_path / "out"), max_bytes=size * 2 + size // 2)
    for i in range(5):
        exporter.export(_batch_at(i))
        newest = max((tmp_path / "out").glob("profile-*.pb.gz"), key=lambda p: p.name)
        os.utime(newest, ns=(i * 10**9, i * 10**9))
    files = list((tmp_path / "out").glob("profile-*.pb.gz"))
    assert len(files) == 2
    assert sum(p.stat().st_size for p in files) <= size * 2 + size // 2


def _write_one(directory: Path) -> str:
    FilesProfileExporter(str(directory)).export(_batch_at(0))
    return str(next(directory.glob("*.pb.gz")))


def test_folder_that_is_a_file_counts_and_returns_false(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder should be")
    _check_unwritable(blocker / "sub")


def _check_unwritable(directory: Path) -> None:
    selfmetrics.reset()
    exporter = FilesProfileExporter(str(directory))
    assert exporter.export(batches.cpu_batch()) is False
    assert exporter.export(batches.cpu_batch()) is False
    assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="write_error") == 2
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="files") == 2


def test_a_full_disk_makes_room_by_removing_the_oldest_profile_files_only(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A real tmpfs of three pages, one taken by a file that is not the agent's: from the third profile on, each
    finds no space; the oldest profile file goes (counted, logged once) and the new one is written, no .tmp debris."""
    selfmetrics.reset()
    with small_tmpfs(tmp_path / "full", 3 * 4096) as folder:
        (folder / "metrics.jsonl").write_text("not ours\n")
        exporter = FilesProfileExporter(str(folder))
        results = []
        for i in range(5):
            results.append(exporter.export(_batch_at(i)))
            newest = folder / profile_file_name(_batch_at(i), i + 1)
            if newest.exists():
                os.utime(newest, ns=(i * 10**9, i * 10**9))  # distinct, ordered mtimes whatever the clock resolution
        assert results == [True] * 5
        written = sorted(p.name for p in folder.iterdir())
        assert written == ["metrics.jsonl", *(profile_file_name(_batch_at(i), i + 1) for i in (3, 4))]
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="disk_full") == 3
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="write_error") == 0
    full = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert len(full) == 1 and "removed the 1 oldest profile files to write new ones" in full[0], full


def test_a_disk_full_of_other_files_drops_the_profile_and_touches_none_of_them(tmp_path: Path) -> None:
    selfmetrics.reset()
    with small_tmpfs(tmp_path / "full", 4096) as folder:
        (folder / "profile-not-ours.txt").write_bytes(b"x" * 4096)
        exporter = FilesProfileExporter(str(folder))
        assert exporter.export(_batch_at(0)) is False
        assert [p.name for p in folder.iterdir()] == ["profile-not-ours.txt"]  # nor a temporary file
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="write_error") == 1
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="disk_full") == 0
        (folder / "profile-not-ours.txt").unlink()  # space again: files are written as before
        assert exporter.export(_batch_at(1)) is True
        assert [p.name for p in folder.iterdir()] == [profile_file_name(_batch_at(1), 2)]


def test_a_read_only_folder_is_counted_and_writing_resumes_when_it_is_writable(tmp_path: Path) -> None:
    selfmetrics.reset()
    with small_tmpfs(tmp_path / "ro", 1 << 20) as folder:
        exporter = FilesProfileExporter(str(folder))
        remount(folder, "ro")
        assert exporter.export(_batch_at(0)) is False
        assert list(folder.iterdir()) == []
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="write_error") == 1
        remount(folder, "rw")
        assert exporter.export(_batch_at(1)) is True
        assert [p.name for p in folder.iterdir()] == [profile_file_name(_batch_at(1), 2)]

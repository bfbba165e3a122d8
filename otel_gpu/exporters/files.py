# SPDX-License-Identifier: Apache-2.0
"""Local files: one gzipped pprof (``profile-<type>-<UTC time>-<seq>.pb.gz``) per batch under the output folder.

The folder is kept within ``max_files`` profile files and ``max_bytes`` of them by removing the oldest first;
other files in the folder (metrics, anything else) are never touched. Writing is local and quick, so it happens
on the caller's thread; a file is written under a temporary name and renamed, so readers never see half a file,
and a write that fails removes its temporary file. On a full disk (or quota) the oldest profile files are removed
until the new one fits, and it is written once more: the newest profiles are kept, as the export queue keeps them
(each file removed is counted as dropped, ``disk_full``; logged at once, then at most every
``ROOM_LOG_INTERVAL_S`` with the count).

Insight lines (:mod:`otel_gpu.profiles.insights`: the straggler rank of a distributed job, the GPU time not
measured in each process) are appended to
``summary.txt`` in the folder, one per interval that has one, after the UTC time of the interval's start; the file
is moved to ``summary.txt.1`` (replacing the one before) once it holds ``MAX_SUMMARY_BYTES``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import time
from pathlib import Path

from otel_gpu import selfmetrics, semconv
from otel_gpu.profiles.insights import straggler_line, unmeasured_line
from otel_gpu.profiles.model import ProfileBatch
from otel_gpu.profiles.pprof import encode_pprof

_logger = logging.getLogger(__name__)

PREFIX = "profile-"
SUFFIX = ".pb.gz"
SUMMARY = "summary.txt"
MAX_SUMMARY_BYTES = 1 << 20  # about 4,000 lines: days of intervals with an insight
ROOM_LOG_INTERVAL_S = 300.0  # at most one line this often while a full disk has older files removed for new ones


def profile_file_name(batch: ProfileBatch, sequence: int) -> str:
    """``profile-<sample type>-<YYYYmmddTHHMMSSZ of the batch start>-<sequence>.pb.gz``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(batch.start_unix_nano / 1e9))
    kind = "".join(c if c.isalnum() or c in "_-" else "_" for c in batch.type.sample_type)
    if batch.type.sample_type == "samples" and batch.type.period_type:
        kind = batch.type.period_type  # "cpu" says more than "samples"
    return f"{PREFIX}{kind}-{stamp}-{sequence:06d}{SUFFIX}"


class FilesProfileExporter:
    """Writes gzipped pprof files that ``go tool pprof``, speedscope and Pyroscope read."""

    def __init__(self, directory: str, *, max_files: int = 1000, max_bytes: int = 1 << 30) -> None:
        self.name = "files"
        self.directory = Path(directory)
        self._max_files = max_files
        self._max_bytes = max_bytes
        self._sequence = itertools.count(1)
        self._closed = False
        self._failing = False
        self._removed_unlogged = 0  # files removed to make room on a full disk, not yet in a log line
        self._room_logged_at: float | None = None  # monotonic time of the last line about them
        self._summary_failing = False

    def export(self, batch: ProfileBatch) -> bool:
        if self._closed:
            return False
        path = self.directory / profile_file_name(batch, next(self._sequence))
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            data = encode_pprof(batch)
            try:
                _write(temporary, path, data)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._make_room(len(data), exc):
                    raise
                _write(temporary, path, data)
        except OSError as exc:
            selfmetrics.count(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter=self.name,
                              otel_gpu__signal=semconv.Signal.PROFILES)
            selfmetrics.count(semconv.SELF_DROPPED.name, otel_gpu__reason=semconv.Reason.WRITE_ERROR,
                              otel_gpu__signal=semconv.Signal.PROFILES, otel_gpu__exporter=self.name)
            if not self._failing:
                _logger.warning("cannot write profile files to %s: %s (further failures are only counted)",
                                self.directory, exc)
            self._failing = True
            return False
        if self._failing:
            _logger.info("writing profile files to %s works again", self.directory)
            self._failing = False
        self._clean_up()
        try:
            self._summarize(batch)
        except OSError as exc:  # the profile is written: only the insight line is lost
            selfmetrics.count(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter=self.name,
                              otel_gpu__signal=semconv.Signal.PROFILES)
            if not self._summary_failing:
                _logger.warning("cannot write %s in %s: %s (further failures are only counted)", SUMMARY,
                                self.directory, exc)
            self._summary_failing = True
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self._closed = True

    def _summarize(self, batch: ProfileBatch) -> None:
        """Append the batch's insight lines, if any, to the summary file (raises OSError)."""
        lines = [line for line in (straggler_line(batch), unmeasured_line(batch)) if line]
        if not lines:
            return
        summary = self.directory / SUMMARY
        with contextlib.suppress(FileNotFoundError):
            if summary.stat().st_size >= MAX_SUMMARY_BYTES:
                os.replace(summary, summary.with_name(SUMMARY + ".1"))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(batch.start_unix_nano / 1e9))
        with open(summary, "a", encoding="utf-8") as out:
            out.writelines(f"{stamp} {line}\n" for line in lines)

    def _make_room(self, needed_bytes: int, full: OSError) -> bool:
        """The disk is full: remove the oldest profile files until ``needed_bytes`` are free (as far as they go);
        True when any was removed. Each is counted as dropped; logged at once, then at most every
        ``ROOM_LOG_INTERVAL_S`` with the count."""
        removed = freed = 0
        for _, _, _, allocated, entry in self._profile_files():
            if freed >= needed_bytes:
                break
            try:
                entry.unlink()
            except OSError as exc:
                _logger.debug("could not remove %s: %s", entry, exc)
                continue
            removed += 1
            freed += allocated
        if removed:
            selfmetrics.count(semconv.SELF_DROPPED.name, removed, otel_gpu__reason=semconv.Reason.DISK_FULL,
                              otel_gpu__signal=semconv.Signal.PROFILES, otel_gpu__exporter=self.name)
            self._removed_unlogged += removed
            now = time.monotonic()
            if self._room_logged_at is None or now - self._room_logged_at >= ROOM_LOG_INTERVAL_S:
                _logger.warning("%s is full (%s): removed the %d oldest profile files%s to write new ones (counted "
                                "in %s, reason %s; logged again at most every %.0f s)", self.directory,
                                full.strerror or full, self._removed_unlogged,
                                "" if self._room_logged_at is None else f" in {now - self._room_logged_at:.0f} s",
                                semconv.SELF_DROPPED.name, semconv.Reason.DISK_FULL, ROOM_LOG_INTERVAL_S)
                self._removed_unlogged, self._room_logged_at = 0, now
        return removed > 0

    def _profile_files(self) -> list[tuple[int, str, int, int, Path]]:
        """(mtime in ns, name, size, bytes allocated, path) of every profile file in the folder, oldest first (only
        the names this exporter writes: other files are never touched)."""
        files = []
        for entry in self.directory.glob(f"{PREFIX}*{SUFFIX}"):
            try:
                stat = entry.stat()
            except OSError:
                continue  # removed by someone else meanwhile
            files.append((stat.st_mtime_ns, entry.name, stat.st_size, max(stat.st_size, stat.st_blocks * 512), entry))
        files.sort()
        return files

    def _clean_up(self) -> None:
        """Remove the oldest profile files until the folder is within both bounds."""
        files = self._profile_files()
        total = sum(size for _, _, size, _, _ in files)
        while files and (len(files) > self._max_files or total > self._max_bytes):
            _, _, size, _, entry = files.pop(0)
            try:
                entry.unlink()
            except OSError as exc:
                _logger.debug("could not remove %s: %s", entry, exc)
            total -= size


def _write(temporary: Path, path: Path, data: bytes) -> None:
    """Write ``data`` to ``temporary`` and rename it to ``path``; a failed write leaves no temporary file (a full disk
    must not fill up further with half-written files)."""
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise

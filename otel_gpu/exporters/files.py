# SPDX-License-Identifier: Apache-2.0
"""Local files: one gzipped pprof (``profile-<type>-<UTC time>-<seq>.pb.gz``) per batch under the output folder.

The folder is kept within ``max_files`` profile files and ``max_bytes`` of them by removing the oldest first;
other files in the folder (metrics, anything else) are never touched. Writing is local and quick, so it happens
on the caller's thread; a file is written under a temporary name and renamed, so readers never see half a file,
and a write that fails (a full disk) removes its temporary file.

Insight lines (:mod:`otel_gpu.profiles.insights`: the straggler rank of a distributed job, the GPU time not
measured in each process) are appended to
``summary.txt`` in the folder, one per interval that has one, after the UTC time of the interval's start; the file
is moved to ``summary.txt.1`` (replacing the one before) once it holds ``MAX_SUMMARY_BYTES``.
"""

from __future__ import annotations

import contextlib
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
        self._summary_failing = False

    def export(self, batch: ProfileBatch) -> bool:
        if self._closed:
            return False
        path = self.directory / profile_file_name(batch, next(self._sequence))
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(encode_pprof(batch))
            os.replace(temporary, path)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a full disk must not fill up further with half-written files
                temporary.unlink(missing_ok=True)
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

    def _clean_up(self) -> None:
        """Remove the oldest profile files until the folder is within both bounds."""
        files = []
        for entry in self.directory.glob(f"{PREFIX}*{SUFFIX}"):
            try:
                stat = entry.stat()
            except OSError:
                continue  # removed by someone else meanwhile
            files.append((stat.st_mtime_ns, entry.name, stat.st_size, entry))
        files.sort()
        total = sum(size for _, _, size, _ in files)
        while files and (len(files) > self._max_files or total > self._max_bytes):
            _, _, size, entry = files.pop(0)
            try:
                entry.unlink()
            except OSError as exc:
                _logger.debug("could not remove %s: %s", entry, exc)
            total -= size

# SPDX-License-Identifier: Apache-2.0
"""What every profile source is to the agent (:class:`ProfileSource`), and which processes it reports
(:class:`ProcessSelection`, the one rule behind ``--pid``, ``--process-name`` and ``--container-id``).

The agent opens each source once, drains it every reporting interval, stops it before the last drain and closes it
on exit; it never asks which source it holds. Each source applies the selection itself, as early as it can (the CPU
sampler filters pids in the kernel and skips symbolizing processes left out), with the same rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from otel_gpu.config import ProfilingConfig
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import ProcessProfile, ProfileBatch


class ProfileSource(Protocol):
    """A source of profiles: the CPU sampler, GPU time."""

    name: str  # the otel_gpu.source attribute of its self-metrics

    def open(self) -> None:
        """Start collecting; raises :class:`~otel_gpu.errors.SourceUnavailable` (nothing left running) if it cannot."""
        ...

    def drain(self) -> list[ProfileBatch]:
        """Every batch collected since the last drain (a batch may have no processes)."""
        ...

    def stop(self) -> None:
        """No more background collection: the next drain is the last and holds all that was collected."""
        ...

    def close(self) -> None:
        """Release everything (idempotent; also after a failed open)."""
        ...


class ProcessSelection:
    """Which processes are profiled (:meth:`ProfilingConfig.selects`: ``--pid``, ``--container-id``, and
    ``--process-name`` found in the executable's name or in the name of any of its threads)."""

    def __init__(self, config: ProfilingConfig | None = None) -> None:
        self._config = config or ProfilingConfig()

    @property
    def pids(self) -> tuple[int, ...]:
        return self._config.pids

    @property
    def everything(self) -> bool:
        config = self._config
        return not (config.pids or config.process_name or config.container_id)

    def selects(self, info: ProcessInfo, thread_names: Iterable[str] = ()) -> bool:
        """Whether the process ``info`` (whose threads have ``thread_names``) is profiled."""
        names = (name for name in (info.executable_name, *thread_names) if name)
        return self._config.selects(info.pid, info.container_id, names)

    def keep(self, batch: ProfileBatch) -> ProfileBatch:
        """``batch`` with only the selected processes."""
        if self.everything:
            return batch
        kept = tuple(p for p in batch.processes if self.selects(p.process, _thread_names(p)))
        return dataclasses.replace(batch, processes=kept)


def _thread_names(profile: ProcessProfile) -> set[str]:
    return {sample.thread_name for sample in profile.samples if sample.thread_name}

# SPDX-License-Identifier: Apache-2.0
"""A process's place in a distributed job (rank, local rank, world size), from the variables its launcher set.

torchrun (and the launchers that follow its contract: torch.distributed.launch, Accelerate, DeepSpeed, Kubeflow's
PyTorchJob) puts ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in each worker's environment before it starts, so they
are in /proc/PID/environ. Every signal that names a process (gpu_time and sync_wait profiles, per-process GPU metrics)
adds :func:`rank_attributes` of that environment, so one function decides what a rank is.
"""

from __future__ import annotations

from otel_gpu import semconv

MAX_RANK = 1 << 24  # far above any job's world size: a larger number is not a rank
_VARIABLES = ((b"RANK", semconv.DISTRIBUTED_RANK), (b"LOCAL_RANK", semconv.DISTRIBUTED_LOCAL_RANK),
              (b"WORLD_SIZE", semconv.DISTRIBUTED_WORLD_SIZE))


def _value(environ: bytes, name: bytes) -> bytes | None:
    """The value of ``name`` in the NUL-separated ``environ`` (the first one, as getenv reads it), None when unset."""
    prefix = name + b"="
    if environ.startswith(prefix):
        start = len(prefix)
    else:
        start = environ.find(b"\0" + prefix)
        if start < 0:
            return None
        start += 1 + len(prefix)
    end = environ.find(b"\0", start, start + 16)
    return environ[start:end if end >= 0 else start + 16]


def rank_attributes(environ: bytes) -> tuple[tuple[str, int], ...]:
    """``distributed.rank``, ``distributed.local_rank``, ``distributed.world_size`` of the process whose
    /proc/PID/environ text is ``environ``: each one its variable sets to a decimal number in [0, MAX_RANK] (the
    process wrote it: anything else is left out); () outside a distributed job."""
    out = []
    for variable, attribute in _VARIABLES:
        value = _value(environ, variable)
        if value is not None and value.isdigit() and len(value) <= 8 and int(value) <= MAX_RANK:
            out.append((attribute, int(value)))
    return tuple(out)

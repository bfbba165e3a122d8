# SPDX-License-Identifier: Apache-2.0
"""Makes every SpanContextProcessor of this process run its Python hooks: conftest.py puts this folder on PYTHONPATH
for the Python-path runs, so the tests' child programs (workloads, forks, entry points) take that path too."""

from otel_gpu.instrumentation import _processor

_processor.C_HOOKS = False

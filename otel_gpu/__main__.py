# SPDX-License-Identifier: Apache-2.0
"""``python -m otel_gpu`` runs the command line."""

from otel_gpu.cli import main

raise SystemExit(main())

# SPDX-License-Identifier: Apache-2.0
"""Profile model, builder and pure encoders (pprof, OTLP profiles)."""

# SPDX-License-Identifier: Apache-2.0
"""otel-gpu: an OpenTelemetry-native continuous profiler and metrics agent for NVIDIA GPU machines."""

__version__ = "0.1.0"
__all__ = ["__version__"]

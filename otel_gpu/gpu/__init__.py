# SPDX-License-Identifier: Apache-2.0
"""NVML GPU metrics: ``source.NVMLSource`` reads, ``model`` holds the snapshots. Only ``_nvml`` imports pynvml."""

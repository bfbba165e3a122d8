# SPDX-License-Identifier: Apache-2.0
"""Errors shared across the agent's parts."""

from __future__ import annotations


class SourceUnavailable(Exception):
    """A source cannot run on this machine. The message says what is missing and how to turn it on; the agent
    logs it once and keeps running without that source."""

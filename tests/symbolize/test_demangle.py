# SPDX-License-Identifier: Apache-2.0
"""The one demangler: c++filt in a process of its own, its output bounded per name and in time, names it cannot
answer left mangled; the library's short std:: names as __cxa_demangle wrote them."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest

from otel_gpu.symbolize import demangle as demangle_module
from otel_gpu.symbolize.demangle import MAX_DEMANGLED_BYTES, Demangler

needs_cxxfilt = pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt (binutils) not installed")


@needs_cxxfilt
def test_std_names_stay_short_as_the_kernel_names_were() -> None:
    demangler = Demangler()
    demangler.prepare(["_ZNKSi6gcountEv", "_ZNSs4swapERSs", "_Z6matmulPfS_S_i"])
    assert demangler.demangle("_ZNKSi6gcountEv") == "std::istream::gcount() const"  # not std::basic_istream<...>
    assert demangler.demangle("_ZNSs4swapERSs") == "std::string::swap(std::string&)"
    assert demangler.demangle("_Z6matmulPfS_S_i") == "matmul(float*, float*, float*, int)"


def expanding_name(levels: int) -> str:
    """A valid mangled name of ~11 bytes per level whose demangled form doubles with each level (f(a, b<a, a>,
    b<b<a, a>, b<a, a> >, ...): each parameter refers twice to the one before); 16 levels: 190 bytes -> 1.7 MB."""
    def ref(index: int) -> str:  # the substitution S_, S0_, S1_, ... S9_, SA_, ...
        if index == 0:
            return "S_"
        digits, text, index = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", "", index - 1
        while True:
            text, index = digits[index % 36] + text, index // 36
            if not index:
                return f"S{text}_"
    return "_Z1f1a1bIS_S_E" + "".join("S0_I" + ref(2 + k) * 2 + "E" for k in range(levels))


@needs_cxxfilt
def test_a_name_that_demangles_to_megabytes_is_cut_and_the_batch_goes_on() -> None:
    """Any process names its symbols: 190 bytes that demangle to 1.7 MB (the agent kept all of it before)."""
    huge = expanding_name(16)
    demangler = Demangler()
    demangler.prepare([huge, "_ZN3foo3barEv", "_Z1gv"])  # sorted: the huge name is read first
    shown = demangler.demangle(huge)
    assert shown.startswith("f(a, b<a, a>, b<b<a, a>") and shown.endswith("...")
    assert len(shown) == MAX_DEMANGLED_BYTES + 3
    assert demangler.demangle("_ZN3foo3barEv") == "foo::bar()" and demangler.demangle("_Z1gv") == "g()"


def test_a_demangler_that_hangs_is_stopped_and_only_its_stuck_name_stays_mangled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name c++filt takes too long over: the batch is stopped after TIMEOUT_S; the names answered keep their
    answer, the one it was stuck on stays mangled for good, the rest are asked again next time."""
    tool = tmp_path / "c++filt"
    tool.write_text("#!/bin/sh\nread first; echo answered-$first\nexec sleep 60\n")
    tool.chmod(0o755)
    monkeypatch.setattr(demangle_module, "TIMEOUT_S", 0.5)
    demangler = Demangler()
    demangler._tool = str(tool)
    started = time.monotonic()
    demangler.prepare(["_Z1av", "_Z1bv", "_Z1cv"])
    assert time.monotonic() - started < 5
    assert demangler._cache == {"_Z1av": "answered-_Z1av", "_Z1bv": "_Z1bv"}  # _Z1cv: asked again later


def test_without_cxxfilt_names_stay_mangled_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    demangler = Demangler()
    demangler._tool = None
    with caplog.at_level(logging.INFO, logger="otel_gpu.symbolize.demangle"):
        assert demangler.demangle("_Z6matmulPfS_S_i") == "_Z6matmulPfS_S_i"
        assert demangler.demangle("_ZN3foo3barEv") == "_ZN3foo3barEv"
    assert [r.getMessage() for r in caplog.records] == ["c++filt not found: C++ function names stay mangled"]


@needs_cxxfilt
def test_kernel_names_use_the_same_demangler() -> None:
    from otel_gpu.cuda import builder

    assert builder.demangle is demangle_module.demangle
    assert demangle_module.demangle("_Z6matmulPfS_S_i") == "matmul(float*, float*, float*, int)"

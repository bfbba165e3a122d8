# SPDX-License-Identifier: Apache-2.0
"""Symbolization in the agent: ELF symbol tables (:mod:`.elf`), process mappings (:mod:`.maps`), the kernel
(:mod:`.kallsyms`), JIT perf maps (:mod:`.perfmap`), C++ demangling (:mod:`.demangle`), tied together by
:class:`otel_gpu.symbolize.symbolizer.Symbolizer`."""

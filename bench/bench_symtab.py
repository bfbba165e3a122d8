# SPDX-License-Identifier: Apache-2.0
"""Cost of reading an ELF file's function symbols (``ElfSymbols``: headers, notes, .symtab and .dynsym), the native
reader the agent uses (libotel_gpu_symtab.so) side by side with the Python reference (``ElfSymbols(native=False)``).

Each read runs in a fresh interpreter (the module imported and libc read once first, so the library is loaded): the
thread's CPU time for the read and the resident high-water mark it adds (``/proc/self/clear_refs`` then VmHWM,
which sees native allocations too). Readers alternate file by file, median of ``--repeats``; each file is read once
before (its pages in the page cache for both). Files: libc, libpython, the largest ELF files of this machine (libLLVM,
libclang-cpp, librustc_driver), any ``--elf``, and a generated library of ``--generated`` C++-like symbols
(libtorch_cpu.so has ~1 M functions; 0 to skip).

Run (after make build): .venv/bin/python bench/bench_symtab.py [--repeats 3] [--generated 1000000] [--elf PATH ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_FILES = ["/lib/x86_64-linux-gnu/libc.so.6", *map(str, sorted(Path("/usr/lib/x86_64-linux-gnu").glob(
    "libpython3*.so.1.0"))), "/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", "/usr/lib/llvm-14/lib/libclang-cpp.so.14",
    *map(str, sorted(Path("/root/.rustup/toolchains").glob("*/lib/librustc_driver-*.so")))]

_CHILD = """
import sys, time
from otel_gpu.symbolize.elf import ElfSymbols

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(field + ":"))

ElfSymbols("/lib/x86_64-linux-gnu/libc.so.6", native=sys.argv[2] == "native")
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
before = status("VmRSS")
started = time.thread_time()
elf = ElfSymbols(sys.argv[1], native=sys.argv[2] == "native")
cpu_s = time.thread_time() - started
print(elf.symbol_count, cpu_s, status("VmHWM") - before)
"""


def _read(path: str, reader: str) -> tuple[int, float, int]:
    """(functions, CPU-s, +KiB peak) of one read in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _CHILD, path, reader], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout.split()
    return int(out[0]), float(out[1]), int(out[2])


def _generated(count: int, folder: Path) -> str:
    from tests.symbolize.elfgen import cxx_like_symbols, write_elf
    path = folder / f"libgenerated_{count}.so"
    write_elf(path, cxx_like_symbols(count))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generated", type=int, default=1_000_000, help="symbols of the generated library (0: none)")
    parser.add_argument("--elf", nargs="*", default=[], help="more files")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        files = [path for path in [*DEFAULT_FILES, *options.elf] if Path(path).is_file()]
        if options.generated:
            files.append(_generated(options.generated, Path(scratch)))
        print("| file | MiB | functions | Python CPU-s | native CPU-s | ratio | Python +MiB | native +MiB |")
        print("|---|---|---|---|---|---|---|---|")
        for path in files:
            _read(path, "native")  # the file's pages in the page cache for both readers
            found: dict[str, list[tuple[int, float, int]]] = {"python": [], "native": []}
            for _ in range(options.repeats):
                for reader, runs in found.items():
                    runs.append(_read(path, reader))
            functions = {count for count, _cpu, _kib in found["python"] + found["native"]}
            assert len(functions) == 1, f"{path}: readers disagree on the function count: {functions}"
            cpu = {reader: statistics.median(cpu_s for _n, cpu_s, _kib in runs) for reader, runs in found.items()}
            peak = {reader: statistics.median(kib for _n, _cpu, kib in runs) / 1024 for reader, runs in found.items()}
            print(f"| {Path(path).name} | {Path(path).stat().st_size / (1 << 20):.0f} | {functions.pop():,} | "
                  f"{cpu['python']:.4f} | {cpu['native']:.4f} | {cpu['python'] / max(cpu['native'], 1e-6):.0f} | "
                  f"{peak['python']:.1f} | {peak['native']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

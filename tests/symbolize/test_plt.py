# SPDX-License-Identifier: Apache-2.0
"""PLT stubs are named as objdump names them (``name@plt``), by the Python and the native symbol-table readers alike,
and no symbol of unknown size (``_init``) runs past its section into them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.symbolize.elf import ElfSymbols
from otel_gpu.symbolize.plt import PLT_NAME

LIBRARIES = [Path("/usr/lib/x86_64-linux-gnu") / name for name in
             ("libc.so.6", "libz.so.1", "libcrypto.so.3", "libstdc++.so.6", "libpython3.11.so.1")]
# the audit's library: .plt stubs named _init, the one symbol before them (size 0, in .init)
LIBPYTHON_312 = Path("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0")
_LABEL = re.compile(r"^([0-9a-f]+) <(.+)>:$", re.M)
_ABSOLUTE = re.compile(r"^\*ABS\*\+0x([0-9a-f]+)@plt$")  # an IRELATIVE slot: objdump gives the IFUNC's address


def _objdump_stubs(path: Path) -> list[tuple[int, str]]:
    """(address, label) of every stub objdump disassembles in the file's PLT sections."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    out = subprocess.run(["objdump", "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", str(path)],
                         capture_output=True, text=True, check=False).stdout
    return [(int(address, 16), label) for address, label in _LABEL.findall(out)]


def _expected(elf: ElfSymbols, label: str) -> str:
    absolute = _ABSOLUTE.match(label)
    if absolute:  # we name the IFUNC itself
        found = elf.lookup(int(absolute.group(1), 16))
        assert found is not None, label
        return f"{found[0]}@plt"
    return label if label.endswith("@plt") and not label.endswith("-0x10") else PLT_NAME  # PLT0: .plt or x@plt-0x10


def _check_every_stub(path: Path) -> int:
    stubs = _objdump_stubs(path)
    assert stubs, f"{path}: no PLT"
    for native in (True, False):
        elf = ElfSymbols(str(path), native=native)
        wrong = []
        for address, label in stubs:
            for inside in (address, address + 7):  # a stub's first and a later byte
                found = elf.lookup(inside)
                if found != (_expected(elf, label), inside - address):
                    wrong.append((hex(inside), label, found))
        assert not wrong, (str(path), native, wrong[:10])
    return len(stubs)


@pytest.mark.parametrize("path", [*LIBRARIES, LIBPYTHON_312], ids=lambda path: path.name)
def test_every_stub_of_a_system_library_is_named_like_objdump(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    assert _check_every_stub(path) > 10


def test_the_audits_libpython_stubs_are_not_init() -> None:
    if not LIBPYTHON_312.exists():
        pytest.skip(f"{LIBPYTHON_312} is not on this machine (pyenv's 3.12.1)")
    elf = ElfSymbols(str(LIBPYTHON_312))
    names = [found[0] for offset in (0x109580, 0x10A8A0, 0x1085E0)
             if (vaddr := elf.vaddr_of(offset)) is not None and (found := elf.lookup(vaddr)) is not None]
    assert len(names) == 3 and all(name.endswith("@plt") for name in names), names


@pytest.mark.parametrize("flags", [[], ["-Wl,-z,now"], ["-fcf-protection=full", "-Wl,-z,ibtplt"],
                                   ["-fcf-protection=full", "-Wl,-z,ibtplt", "-Wl,-z,now"]],
                         ids=["lazy", "now", "ibt-lazy", "ibt-now"])
def test_stubs_of_every_plt_layout_are_named_like_objdump(tmp_path: Path, flags: list[str]) -> None:
    """.plt alone, .plt with .plt.got, and IBT's .plt + .plt.sec (whose lazy .plt stubs only push their index)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    source = tmp_path / "calls.c"
    source.write_text("#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\n"
                      "int f(const char *s) { void *(*p)(size_t) = malloc; char *b = p(9); strcpy(b, s); puts(b);"
                      " free(b); return (int)strlen(s); }\n")
    library = tmp_path / "libcalls.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", *flags, "-o", str(library), str(source)], check=True)
    assert _check_every_stub(library) >= 5
    elf = ElfSymbols(str(library))
    named = {elf.lookup(address)[0] for address, _label in _objdump_stubs(library)}  # type: ignore[index]
    assert {"malloc@plt", "free@plt", "puts@plt", "strlen@plt"} <= named, named


def test_stubs_of_a_closed_file_are_named_plt() -> None:
    path = LIBRARIES[0]
    stubs = _objdump_stubs(path)
    elf = ElfSymbols(str(path))
    address, label = next((a, lab) for a, lab in stubs if lab == "realloc@plt")
    elf.close()
    assert elf.lookup(address) == (PLT_NAME, 0)

# SPDX-License-Identifier: Apache-2.0
"""What the verifier saw of each program of compiled BPF objects: instructions verified (its cost of loading, within
the kernel's 1 M limit), translated and JIT-ed bytes, and the load time; objects side by side, e.g. main's and a
branch's, to check that a change to a program keeps it cheap to verify.

Run (as root, after make build): .venv/bin/python bench/bpf_program_size.py OBJECT.bpf.o [OBJECT.bpf.o ...]
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from otel_gpu.ebpf import _libbpf  # noqa: E402
from otel_gpu.ebpf.loader import BPFObject  # noqa: E402

_INFO_BYTES = 232  # struct bpf_prog_info up to and past verified_insns (offset 216)
_JITED_LEN, _XLATED_LEN, _VERIFIED_INSNS = 16, 20, 216  # offsets in struct bpf_prog_info (linux/bpf.h)


def program_sizes(path: str) -> list[tuple[str, int, int, int, float]]:
    """(program, verified instructions, xlated bytes, jited bytes, load seconds) of each program in the object."""
    lib = _libbpf.lib()
    lib.bpf_prog_get_fd_by_id.argtypes = [ctypes.c_uint32]
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    started = time.monotonic()
    out = []
    with BPFObject(path) as obj:
        load_s = time.monotonic() - started
        for name, program_id in sorted(obj.program_ids().items()):
            fd = lib.bpf_prog_get_fd_by_id(program_id)
            info, size = (ctypes.c_uint8 * _INFO_BYTES)(), ctypes.c_uint32(_INFO_BYTES)
            try:
                if lib.bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)):
                    raise OSError(f"bpf_obj_get_info_by_fd failed for {name}")
            finally:
                os.close(fd)
            raw = bytes(info)

            def field(offset: int, raw: bytes = raw) -> int:
                return int.from_bytes(raw[offset:offset + 4], "little")
            out.append((name, field(_VERIFIED_INSNS), field(_XLATED_LEN), field(_JITED_LEN), load_s))
    return out


def main() -> None:
    print(f"{'object':<60} {'program':<20} {'verified insns':>14} {'xlated B':>9} {'jited B':>8} {'load s':>7}")
    for path in sys.argv[1:]:
        for name, verified, xlated, jited, load_s in program_sizes(path):
            print(f"{path[-60:]:<60} {name:<20} {verified:>14} {xlated:>9} {jited:>8} {load_s:>7.2f}")


if __name__ == "__main__":
    main()

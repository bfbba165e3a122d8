/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPython's structure layouts (default build, x86-64), the one table of them: the injected library's in-process
 * frame reader (pyframes.c) includes it, and the agent's CPU profiler (otel_gpu/cpu/python.py) reads it as data to
 * fill the BPF walker's offsets (cpu_profiler.h: struct otel_gpu_python_proc), so both walk the same layouts.
 *
 * Offsets printed by offsetof() against each version's internal headers (Include/internal/pycore_runtime.h,
 * pycore_interp.h, pycore_frame.h, Include/cpython/pystate.h, code.h, unicodeobject.h; 3.10: frameobject.h), for
 * pyenv's 3.10.13, 3.11.7, 3.12.1, 3.13.0 and Debian's 3.11 (the same as 3.11.7); tests/cpu/test_python_layouts.py
 * checks them against the running interpreters. 3.13+ also publish them in _Py_DebugOffsets, which the agent reads
 * first, so a newer version works without a row here. Keep the one-field-per-line form: the agent parses it.
 */
#ifndef OTEL_GPU_PYTHON_LAYOUTS_H
#define OTEL_GPU_PYTHON_LAYOUTS_H

#include <stddef.h>

struct py_layout {
    unsigned long minor_hex;           /* 0x030B0000 etc.: major.minor of Py_Version */
    int frame_objects;                 /* 1: frames are PyFrameObjects (3.10), 0: _PyInterpreterFrames (3.11+) */
    int has_cframe;                    /* 3.11, 3.12: tstate->cframe->current_frame; 3.13: tstate->current_frame */
    size_t runtime_interpreters_head;  /* _PyRuntimeState.interpreters.head */
    size_t interp_threads_head;        /* PyInterpreterState.threads.head (3.10: tstate_head) */
    size_t tstate_next;                /* PyThreadState.next */
    size_t tstate_thread_id;           /* PyThreadState.thread_id: pthread_self() */
    size_t tstate_frame;               /* frame (3.10), cframe (3.11/3.12) or current_frame (3.13) in PyThreadState */
    size_t cframe_current;             /* offset of current_frame in _PyCFrame */
    size_t frame_code;                 /* f_code (3.10-3.12), f_executable (3.13) */
    size_t frame_previous;             /* f_back (3.10), previous */
    size_t frame_instr;                /* f_lasti (3.10), prev_instr (3.11/3.12), instr_ptr (3.13) */
    size_t frame_owner;
    int frame_is_entry;                /* 3.11: the frame an evaluation loop was entered with; -1: none */
    int owner_cstack;                  /* FRAME_OWNED_BY_CSTACK (3.12+), -1 when the version has none */
    size_t code_filename;
    size_t code_name;
    size_t code_qualname;              /* 3.10 has no co_qualname: co_name */
    size_t code_firstlineno;
    size_t code_linetable;             /* 3.10: (bytecode delta, line delta) pairs; 3.11+: the location table */
    size_t code_firsttraceable;
    size_t code_adaptive;              /* co_code_adaptive: the instructions */
    size_t ascii_size;                 /* sizeof(PyASCIIObject): where compact ASCII data starts */
    size_t compact_utf8_length;
    size_t compact_utf8;
    size_t compact_size;               /* sizeof(PyCompactUnicodeObject): where compact non-ASCII data starts */
};

static const struct py_layout py_layouts[] = {
    { /* CPython 3.10 */
        .minor_hex = 0x030A0000,
        .frame_objects = 1,
        .has_cframe = 0,
        .runtime_interpreters_head = 32,    /* _PyRuntimeState.interpreters.head */
        .interp_threads_head = 8,           /* PyInterpreterState.tstate_head */
        .tstate_next = 8,                   /* PyThreadState.next */
        .tstate_thread_id = 176,            /* PyThreadState.thread_id */
        .tstate_frame = 24,                 /* PyThreadState.frame */
        .cframe_current = 0,                /* (no _PyCFrame) */
        .frame_code = 32,                   /* PyFrameObject.f_code */
        .frame_previous = 24,               /* PyFrameObject.f_back */
        .frame_instr = 96,                  /* PyFrameObject.f_lasti */
        .frame_owner = 0,                   /* (none) */
        .frame_is_entry = -1,               /* (none: one evaluation loop per frame) */
        .owner_cstack = -1,                 /* (none) */
        .code_filename = 104,               /* PyCodeObject.co_filename */
        .code_name = 112,                   /* PyCodeObject.co_name */
        .code_qualname = 112,               /* PyCodeObject.co_name (no co_qualname) */
        .code_firstlineno = 40,             /* PyCodeObject.co_firstlineno */
        .code_linetable = 120,              /* PyCodeObject.co_linetable */
        .code_firsttraceable = 0,           /* (none) */
        .code_adaptive = 0,                 /* (none) */
        .ascii_size = 48,                   /* sizeof(PyASCIIObject) */
        .compact_utf8_length = 48,          /* PyCompactUnicodeObject.utf8_length */
        .compact_utf8 = 56,                 /* PyCompactUnicodeObject.utf8 */
        .compact_size = 72,                 /* sizeof(PyCompactUnicodeObject) */
    },
    { /* CPython 3.11 */
        .minor_hex = 0x030B0000,
        .frame_objects = 0,
        .runtime_interpreters_head = 40,    /* _PyRuntimeState.interpreters.head */
        .interp_threads_head = 16,          /* PyInterpreterState.threads.head */
        .tstate_next = 8,                   /* PyThreadState.next */
        .tstate_thread_id = 152,            /* PyThreadState.thread_id */
        .has_cframe = 1,                    /* tstate->cframe->current_frame */
        .tstate_frame = 56,                 /* PyThreadState.cframe */
        .cframe_current = 8,                /* _PyCFrame.current_frame */
        .frame_code = 32,                   /* _PyInterpreterFrame.f_code */
        .frame_previous = 48,               /* _PyInterpreterFrame.previous */
        .frame_instr = 56,                  /* _PyInterpreterFrame.prev_instr */
        .frame_owner = 69,                  /* _PyInterpreterFrame.owner */
        .frame_is_entry = 68,               /* _PyInterpreterFrame.is_entry */
        .owner_cstack = -1,                 /* (none in 3.11) */
        .code_filename = 112,               /* PyCodeObject.co_filename */
        .code_name = 120,                   /* PyCodeObject.co_name */
        .code_qualname = 128,               /* PyCodeObject.co_qualname */
        .code_firstlineno = 72,             /* PyCodeObject.co_firstlineno */
        .code_linetable = 136,              /* PyCodeObject.co_linetable */
        .code_firsttraceable = 168,         /* PyCodeObject._co_firsttraceable */
        .code_adaptive = 184,               /* PyCodeObject.co_code_adaptive */
        .ascii_size = 48,                   /* sizeof(PyASCIIObject) */
        .compact_utf8_length = 48,          /* PyCompactUnicodeObject.utf8_length */
        .compact_utf8 = 56,                 /* PyCompactUnicodeObject.utf8 */
        .compact_size = 72,                 /* sizeof(PyCompactUnicodeObject) */
    },
    { /* CPython 3.12 */
        .minor_hex = 0x030C0000,
        .frame_objects = 0,
        .runtime_interpreters_head = 40,    /* _PyRuntimeState.interpreters.head */
        .interp_threads_head = 72,          /* PyInterpreterState.threads.head */
        .tstate_next = 8,                   /* PyThreadState.next */
        .tstate_thread_id = 136,            /* PyThreadState.thread_id */
        .has_cframe = 1,                    /* tstate->cframe->current_frame */
        .tstate_frame = 56,                 /* PyThreadState.cframe */
        .cframe_current = 0,                /* _PyCFrame.current_frame */
        .frame_code = 0,                    /* _PyInterpreterFrame.f_code */
        .frame_previous = 8,                /* _PyInterpreterFrame.previous */
        .frame_instr = 56,                  /* _PyInterpreterFrame.prev_instr */
        .frame_owner = 70,                  /* _PyInterpreterFrame.owner */
        .frame_is_entry = -1,               /* (none: shim frames mark entries) */
        .owner_cstack = 3,                  /* FRAME_OWNED_BY_CSTACK */
        .code_filename = 112,               /* PyCodeObject.co_filename */
        .code_name = 120,                   /* PyCodeObject.co_name */
        .code_qualname = 128,               /* PyCodeObject.co_qualname */
        .code_firstlineno = 68,             /* PyCodeObject.co_firstlineno */
        .code_linetable = 136,              /* PyCodeObject.co_linetable */
        .code_firsttraceable = 176,         /* PyCodeObject._co_firsttraceable */
        .code_adaptive = 192,               /* PyCodeObject.co_code_adaptive */
        .ascii_size = 40,                   /* sizeof(PyASCIIObject) */
        .compact_utf8_length = 40,          /* PyCompactUnicodeObject.utf8_length */
        .compact_utf8 = 48,                 /* PyCompactUnicodeObject.utf8 */
        .compact_size = 56,                 /* sizeof(PyCompactUnicodeObject) */
    },
    { /* CPython 3.13 */
        .minor_hex = 0x030D0000,
        .frame_objects = 0,
        .runtime_interpreters_head = 632,   /* _PyRuntimeState.interpreters.head */
        .interp_threads_head = 7344,        /* PyInterpreterState.threads.head */
        .tstate_next = 8,                   /* PyThreadState.next */
        .tstate_thread_id = 152,            /* PyThreadState.thread_id */
        .has_cframe = 0,                    /* tstate->current_frame */
        .tstate_frame = 72,                 /* PyThreadState.current_frame */
        .cframe_current = 0,                /* (no _PyCFrame) */
        .frame_code = 0,                    /* _PyInterpreterFrame.f_executable */
        .frame_previous = 8,                /* _PyInterpreterFrame.previous */
        .frame_instr = 56,                  /* _PyInterpreterFrame.instr_ptr */
        .frame_owner = 70,                  /* _PyInterpreterFrame.owner */
        .frame_is_entry = -1,               /* (none: shim frames mark entries) */
        .owner_cstack = 3,                  /* FRAME_OWNED_BY_CSTACK */
        .code_filename = 112,               /* PyCodeObject.co_filename */
        .code_name = 120,                   /* PyCodeObject.co_name */
        .code_qualname = 128,               /* PyCodeObject.co_qualname */
        .code_firstlineno = 68,             /* PyCodeObject.co_firstlineno */
        .code_linetable = 136,              /* PyCodeObject.co_linetable */
        .code_firsttraceable = 184,         /* PyCodeObject._co_firsttraceable */
        .code_adaptive = 200,               /* PyCodeObject.co_code_adaptive */
        .ascii_size = 40,                   /* sizeof(PyASCIIObject) */
        .compact_utf8_length = 40,          /* PyCompactUnicodeObject.utf8_length */
        .compact_utf8 = 48,                 /* PyCompactUnicodeObject.utf8 */
        .compact_size = 56,                 /* sizeof(PyCompactUnicodeObject) */
    },
};

#endif /* OTEL_GPU_PYTHON_LAYOUTS_H */

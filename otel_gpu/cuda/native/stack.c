/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The calling thread's stack at a sampled CUDA call: native PCs by eh_frame unwinding (_Unwind_Backtrace from
 * libgcc_s: libcuda, libcupti and libtorch have no frame pointers), with the library's own and CUPTI's frames cut
 * off so that the stack starts at the CUDA API entry point; then the CPython frames: read directly for CPython 3.11-3.13
 * (pyframes.c, no GIL needed), else through the C API when the thread holds the GIL. Per-thread output buffers are the caller's; nothing is allocated here.
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <unwind.h>

#include "inject.h"

/* Address ranges [lo, hi) of the executable segments whose frames are not the application's. */
struct code_range {
    uintptr_t lo;
    uintptr_t hi;
};
#define MAX_SKIPPED_RANGES 8
static struct code_range skipped[MAX_SKIPPED_RANGES];
static int skipped_count;

static int add_ranges_of(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t base = *(uintptr_t *)data;
    if (info->dlpi_addr != base)
        return 0;
    for (int i = 0; i < info->dlpi_phnum && skipped_count < MAX_SKIPPED_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || (ph->p_flags & PF_X) == 0)
            continue;
        skipped[skipped_count].lo = info->dlpi_addr + ph->p_vaddr;
        skipped[skipped_count].hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        skipped_count++;
    }
    return 1;
}

/* Skips the frames of the object that contains addr. */
static void skip_object_of(const void *addr)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (addr == NULL || dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP) == 0 || map == NULL)
        return;
    uintptr_t base = map->l_addr;
    dl_iterate_phdr(add_ranges_of, &base);
}

static int is_skipped(uintptr_t pc)
{
    for (int i = 0; i < skipped_count; i++)
        if (pc >= skipped[i].lo && pc < skipped[i].hi)
            return 1;
    return 0;
}

/* CPython's C API, resolved once in the process's global scope (present only when the process runs CPython). */
typedef void PyObject;
static struct {
    int ready;
    PyObject *(*thread_state_unchecked)(void);
    int (*gil_check)(void);
    PyObject *(*eval_get_frame)(void);
    PyObject *(*frame_get_back)(PyObject *);
    PyObject *(*frame_get_code)(PyObject *);
    int (*frame_get_line)(PyObject *);
    PyObject *(*get_attr)(PyObject *, const char *);
    const char *(*unicode_utf8)(PyObject *);
    long (*long_as_long)(PyObject *);
    void (*inc_ref)(PyObject *);
    void (*dec_ref)(PyObject *);
    void (*err_fetch)(PyObject **, PyObject **, PyObject **);
    void (*err_restore)(PyObject *, PyObject *, PyObject *);
    int loop_per_frame; /* 3.10 and older (no Py_Version): every Python call runs its own evaluation loop */
} py;

static void python_resolve(void)
{
    py.thread_state_unchecked = dlsym(RTLD_DEFAULT, "PyThreadState_GetUnchecked"); /* 3.13+ */
    if (py.thread_state_unchecked == NULL)
        py.thread_state_unchecked = dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet"); /* 3.8 .. 3.12 */
    py.gil_check = dlsym(RTLD_DEFAULT, "PyGILState_Check");
    py.eval_get_frame = dlsym(RTLD_DEFAULT, "PyEval_GetFrame");
    py.frame_get_back = dlsym(RTLD_DEFAULT, "PyFrame_GetBack");
    py.frame_get_code = dlsym(RTLD_DEFAULT, "PyFrame_GetCode");
    py.frame_get_line = dlsym(RTLD_DEFAULT, "PyFrame_GetLineNumber");
    py.get_attr = dlsym(RTLD_DEFAULT, "PyObject_GetAttrString");
    py.unicode_utf8 = dlsym(RTLD_DEFAULT, "PyUnicode_AsUTF8");
    py.long_as_long = dlsym(RTLD_DEFAULT, "PyLong_AsLong");
    py.inc_ref = dlsym(RTLD_DEFAULT, "Py_IncRef");
    py.dec_ref = dlsym(RTLD_DEFAULT, "Py_DecRef");
    py.err_fetch = dlsym(RTLD_DEFAULT, "PyErr_Fetch");
    py.err_restore = dlsym(RTLD_DEFAULT, "PyErr_Restore");
    py.loop_per_frame = dlsym(RTLD_DEFAULT, "Py_Version") == NULL;
    py.ready = py.thread_state_unchecked && py.gil_check && py.eval_get_frame && py.frame_get_back &&
               py.frame_get_code && py.frame_get_line && py.get_attr && py.unicode_utf8 && py.long_as_long &&
               py.inc_ref && py.dec_ref && py.err_fetch && py.err_restore;
}

void stack_init(void)
{
    skip_object_of((const void *)stack_init);                 /* this library */
    skip_object_of((const void *)g_cupti.enable_callback);    /* libcupti */
    skip_object_of((const void *)_Unwind_Backtrace);          /* libgcc_s (the unwinder's own frame) */
    python_resolve();
    pyframes_init();
}

struct unwind_state {
    struct otel_gpu_stack *stack;
    int started; /* the first application frame has been seen */
};

static _Unwind_Reason_Code on_frame(struct _Unwind_Context *ctx, void *arg)
{
    struct unwind_state *st = arg;
    uintptr_t pc = _Unwind_GetIP(ctx);
    if (pc == 0)
        return _URC_END_OF_STACK;
    if (!st->started) {
        if (is_skipped(pc))
            return _URC_NO_REASON;
        st->started = 1;
    }
    if (st->stack->native_count >= OTEL_GPU_MAX_NATIVE_FRAMES) {
        st->stack->flags |= 2;
        return _URC_END_OF_STACK;
    }
    st->stack->native[st->stack->native_count++] = pc;
    return _URC_NO_REASON;
}

/* Appends s (NUL-terminated) to the strings area; returns its offset, or the offset of "" when it does not fit. */
static uint32_t put_string(struct otel_gpu_stack *stack, const char *s)
{
    size_t len = s ? strlen(s) : 0;
    if (stack->strings_len + len + 1 > OTEL_GPU_MAX_STRINGS) {
        stack->flags |= 4;
        return 0; /* offset 0 always holds "" */
    }
    uint32_t at = stack->strings_len;
    memcpy(stack->strings + at, s ? s : "", len);
    stack->strings[at + len] = '\0';
    stack->strings_len += (uint32_t)(len + 1);
    return at;
}

static uint32_t put_code_string(struct otel_gpu_stack *stack, PyObject *code, const char *attr, const char *fallback)
{
    PyObject *value = py.get_attr(code, attr);
    if (value == NULL && fallback != NULL)
        value = py.get_attr(code, fallback); /* co_qualname is 3.11+ */
    if (value == NULL)
        return 0;
    const char *utf8 = py.unicode_utf8(value);
    uint32_t at = put_string(stack, utf8);
    py.dec_ref(value);
    return at;
}

static void python_capture(struct otel_gpu_stack *stack)
{
    if (!py.ready || py.thread_state_unchecked() == NULL || !py.gil_check())
        return;
    PyObject *type, *value, *traceback;
    py.err_fetch(&type, &value, &traceback); /* never disturb a pending exception; errors below are cleared */
    stack->strings_len = 1;
    stack->strings[0] = '\0';
    PyObject *frame = py.eval_get_frame(); /* borrowed */
    if (frame != NULL)
        py.inc_ref(frame); /* the loop owns one reference to the frame it looks at */
    while (frame != NULL) {
        if (stack->python_count >= OTEL_GPU_MAX_PYTHON_FRAMES) {
            stack->flags |= 4;
            py.dec_ref(frame);
            break;
        }
        struct otel_gpu_python_frame *out = &stack->python[stack->python_count++];
        out->line = (uint32_t)py.frame_get_line(frame);
        PyObject *code = py.frame_get_code(frame); /* new reference */
        out->name_offset = put_code_string(stack, code, "co_qualname", "co_name");
        out->filename_offset = put_code_string(stack, code, "co_filename", NULL);
        PyObject *first = py.get_attr(code, "co_firstlineno");
        out->first_line = first ? (uint32_t)py.long_as_long(first) & ~OTEL_GPU_PYTHON_ENTRY : 0;
        if (py.loop_per_frame)
            out->first_line |= OTEL_GPU_PYTHON_ENTRY;
        if (first)
            py.dec_ref(first);
        py.dec_ref(code);
        PyObject *back = py.frame_get_back(frame); /* new reference or NULL */
        py.dec_ref(frame);
        frame = back;
    }
    if (stack->python_count > 0)
        stack->flags |= 1;
    py.err_restore(type, value, traceback); /* also clears anything a failed lookup above left set */
}

void stack_capture(struct otel_gpu_stack *stack)
{
    stack->native_count = 0;
    stack->python_count = 0;
    stack->strings_len = 0;
    stack->flags = 0;
    struct unwind_state st = {stack, 0};
    _Unwind_Backtrace(on_frame, &st);
    /* The direct reader works with or without the GIL; the C API only with it, for versions the reader lacks. */
    if (!pyframes_capture(stack))
        python_capture(stack);
}

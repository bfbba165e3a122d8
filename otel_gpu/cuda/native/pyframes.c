/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The calling thread's CPython frames read straight from the interpreter's structures, WITHOUT the GIL: PyTorch
 * releases the GIL around its operators, so at a kernel launch the launching thread usually does not hold it and the
 * C API may not be called. The thread's own frame chain cannot change while the thread is inside our callback, and
 * everything read here is immutable (code objects, their name/filename strings and line tables), so reading without
 * the GIL is safe; nothing is written, no reference counts are touched, nothing is allocated.
 *
 * Layouts of CPython 3.11, 3.12 and 3.13 from python_layouts.h, the table the agent's BPF walker reads too.
 * Any other version, or a free-threaded build, makes this reader switch itself off (the C-API reader in stack.c
 * still works when the GIL is held). Every object read is type-checked (PyCode_Type, PyUnicode_Type, PyBytes_Type).
 */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "inject.h"

#include "python_layouts.h"

#define OB_TYPE 8         /* offsetof(PyObject, ob_type) */
#define VAR_SIZE 16       /* offsetof(PyVarObject, ob_size) */
#define BYTES_DATA 32     /* offsetof(PyBytesObject, ob_sval) */
#define STR_LENGTH 16     /* offsetof(PyASCIIObject, length) */
#define STR_STATE 32      /* offsetof(PyASCIIObject, state): interned:2 kind:3 compact:1 ascii:1 */
#define OWNER_GENERATOR 1 /* FRAME_OWNED_BY_GENERATOR */
#define MAX_CHAIN 1024    /* frames walked at most (a corrupt chain must not loop) */

static const struct py_layout *layout;
static const void *code_type, *unicode_type, *bytes_type;
static void *(*this_thread_state)(void);

#define AT(ptr, offset, type) (*(type const *)((const char *)(ptr) + (offset)))

static int is_type(const void *obj, const void *type)
{
    return obj != NULL && AT(obj, OB_TYPE, const void *) == type;
}

/* Reads len bytes at addr of this process without faulting (process_vm_readv fails on unmapped memory). */
static int safe_read(const void *addr, void *out, size_t len)
{
    struct iovec local = {out, len}, remote = {(void *)addr, len};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)len;
}

/*
 * Walks the calling thread's frames once with reads that cannot fault: every frame's code must be a code object.
 * Run at load time (cuInit), usually from a Python thread; without a thread state there is nothing to check.
 */
static int layout_checks_out(void)
{
    const void *tstate = this_thread_state(), *frame = NULL, *code = NULL, *type = NULL;
    if (tstate == NULL)
        return 1;
    if (!safe_read((const char *)tstate + layout->tstate_frame, &frame, sizeof(frame)))
        return 0;
    if (layout->has_cframe && frame != NULL &&
        !safe_read((const char *)frame + layout->cframe_current, &frame, sizeof(frame)))
        return 0;
    for (int checked = 0; frame != NULL && checked < 16; checked++) {
        char owner = 0;
        if (!safe_read((const char *)frame + layout->frame_owner, &owner, 1) ||
            !safe_read((const char *)frame + layout->frame_code, &code, sizeof(code)))
            return 0;
        if (owner != layout->owner_cstack && layout->minor_hex != 0x030D0000) {
            if (code == NULL || !safe_read((const char *)code + OB_TYPE, &type, sizeof(type)) || type != code_type)
                return 0;
        }
        if (!safe_read((const char *)frame + layout->frame_previous, &frame, sizeof(frame)))
            return 0;
    }
    return 1;
}

int pyframes_init(void)
{
    const unsigned long *version = dlsym(RTLD_DEFAULT, "Py_Version");
    const void *type_type = dlsym(RTLD_DEFAULT, "PyType_Type");
    code_type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    unicode_type = dlsym(RTLD_DEFAULT, "PyUnicode_Type");
    bytes_type = dlsym(RTLD_DEFAULT, "PyBytes_Type");
    *(void **)&this_thread_state = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    if (version == NULL || type_type == NULL || code_type == NULL || unicode_type == NULL || bytes_type == NULL ||
        this_thread_state == NULL)
        return 0; /* not a CPython process (or one older than 3.11) */
    /* The object header must be the default build's (a free-threaded build's is larger). */
    if (!is_type(code_type, type_type) || !is_type(unicode_type, type_type))
        return 0;
    for (size_t i = 0; i < sizeof(py_layouts) / sizeof(py_layouts[0]); i++)
        if ((*version & 0xFFFF0000ul) == py_layouts[i].minor_hex && !py_layouts[i].frame_objects)
            layout = &py_layouts[i];
    if (layout != NULL && !layout_checks_out()) {
        log_once("this CPython's frame layout is not the expected one; Python frames only when the GIL is held");
        layout = NULL;
    }
    return layout != NULL;
}

static uint32_t put_bytes(struct otel_gpu_stack *stack, const char *s, size_t len)
{
    if (stack->strings_len + len + 1 > OTEL_GPU_MAX_STRINGS) {
        stack->flags |= 4;
        return 0; /* offset 0 holds "" */
    }
    uint32_t at = stack->strings_len;
    memcpy(stack->strings + at, s, len);
    stack->strings[at + len] = '\0';
    stack->strings_len += (uint32_t)(len + 1);
    return at;
}

/* Appends code points (1, 2 or 4 bytes each) as UTF-8. */
static uint32_t put_code_points(struct otel_gpu_stack *stack, const void *data, int kind, size_t length)
{
    char utf8[OTEL_GPU_MAX_NAME];
    size_t used = 0;
    for (size_t i = 0; i < length; i++) {
        uint32_t c = kind == 1 ? ((const uint8_t *)data)[i]
                   : kind == 2 ? ((const uint16_t *)data)[i]
                               : ((const uint32_t *)data)[i];
        if (used + 4 >= sizeof(utf8))
            break; /* a name this long is cut */
        if (c < 0x80) {
            utf8[used++] = (char)c;
        } else if (c < 0x800) {
            utf8[used++] = (char)(0xC0 | (c >> 6));
            utf8[used++] = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            utf8[used++] = (char)(0xE0 | (c >> 12));
            utf8[used++] = (char)(0x80 | ((c >> 6) & 0x3F));
            utf8[used++] = (char)(0x80 | (c & 0x3F));
        } else {
            utf8[used++] = (char)(0xF0 | (c >> 18));
            utf8[used++] = (char)(0x80 | ((c >> 12) & 0x3F));
            utf8[used++] = (char)(0x80 | ((c >> 6) & 0x3F));
            utf8[used++] = (char)(0x80 | (c & 0x3F));
        }
    }
    return put_bytes(stack, utf8, used);
}

/* A str's text as UTF-8, from the string's own storage (compact strings: every str the compiler makes). */
static uint32_t put_str(struct otel_gpu_stack *stack, const void *str)
{
    if (!is_type(str, unicode_type))
        return put_bytes(stack, "?", 1);
    uint32_t state = AT(str, STR_STATE, uint32_t);
    int kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    size_t length = (size_t)AT(str, STR_LENGTH, ssize_t);
    if (!compact || (kind != 1 && kind != 2 && kind != 4))
        return put_bytes(stack, "?", 1);
    if (ascii)
        return put_bytes(stack, (const char *)str + layout->ascii_size, length);
    const char *utf8 = AT(str, layout->compact_utf8, const char *);
    if (utf8 != NULL)
        return put_bytes(stack, utf8, (size_t)AT(str, layout->compact_utf8_length, ssize_t));
    return put_code_points(stack, (const char *)str + layout->compact_size, kind, length);
}

static int read_varint(const uint8_t **p, const uint8_t *end)
{
    if (*p >= end)
        return 0;
    unsigned read = *(*p)++;
    unsigned value = read & 63, shift = 0;
    while ((read & 64) && *p < end && shift < 24) {
        read = *(*p)++;
        shift += 6;
        value |= (read & 63) << shift;
    }
    return (int)value;
}

static int read_svarint(const uint8_t **p, const uint8_t *end)
{
    unsigned value = (unsigned)read_varint(p, end);
    return (value & 1) ? -(int)(value >> 1) : (int)(value >> 1);
}

/* PyCode_Addr2Line over the 3.11+ location table (Objects/locations.md); byte_offset is into the instructions. */
static int line_of(const void *code, long byte_offset)
{
    int line = AT(code, layout->code_firstlineno, int);
    const void *table = AT(code, layout->code_linetable, const void *);
    if (byte_offset < 0 || !is_type(table, bytes_type))
        return line;
    const uint8_t *p = (const uint8_t *)table + BYTES_DATA;
    const uint8_t *end = p + AT(table, VAR_SIZE, ssize_t);
    long start = 0;
    while (p < end) {
        uint8_t first = *p++;
        int kind = (first >> 3) & 15;
        long length = ((first & 7) + 1) * 2; /* code units of 2 bytes */
        int delta = 0, has_line = 1;
        if (kind == 15)
            has_line = 0; /* no location */
        else if (kind == 14 || kind == 13)
            delta = read_svarint(&p, end);
        else if (kind >= 10)
            delta = kind - 10;
        while (p < end && (*p & 128) == 0)
            p++; /* the rest of this entry (columns) */
        line += delta;
        if (byte_offset < start + length)
            return has_line ? line : -1;
        start += length;
    }
    return -1;
}

/* Marks the last frame kept since *run_start as its run's entry frame (OTEL_GPU_PYTHON_ENTRY); a run with no frame
 * kept has none to mark. */
static void end_run(struct otel_gpu_stack *stack, uint32_t *run_start)
{
    if (stack->python_count > *run_start)
        stack->python[stack->python_count - 1].first_line |= OTEL_GPU_PYTHON_ENTRY;
    *run_start = stack->python_count;
}

/* Appends the thread's Python frames, innermost first; returns 0 when this reader is off or finds no thread state. */
int pyframes_capture(struct otel_gpu_stack *stack)
{
    if (layout == NULL)
        return 0;
    const void *tstate = this_thread_state();
    if (tstate == NULL)
        return 0;
    const void *frame = AT(tstate, layout->tstate_frame, const void *);
    if (layout->has_cframe && frame != NULL)
        frame = AT(frame, layout->cframe_current, const void *);
    if (stack->strings_len == 0) {
        stack->strings[0] = '\0';
        stack->strings_len = 1;
    }
    uint32_t run_start = stack->python_count; /* the first frame of the current evaluation loop's run */
    for (int walked = 0; frame != NULL && walked < MAX_CHAIN; walked++, frame = AT(frame, layout->frame_previous, const void *)) {
        int owner = AT(frame, layout->frame_owner, char);
        if (owner == layout->owner_cstack) { /* 3.12+: the shim frame an evaluation loop starts with */
            end_run(stack, &run_start);
            continue;
        }
        /* 3.11: the frame the evaluation loop was entered with; its run ends with it (or with the last frame kept
         * before it, when this one is not shown) */
        int entry = layout->frame_is_entry >= 0 && AT(frame, layout->frame_is_entry, char);
        const void *code = AT(frame, layout->frame_code, const void *);
        const char *instructions = is_type(code, code_type) ? (const char *)code + layout->code_adaptive : NULL;
        const char *instr = AT(frame, layout->frame_instr, const char *);
        if (instructions == NULL ||
            (owner != OWNER_GENERATOR && instr < instructions + 2 * (long)AT(code, layout->code_firsttraceable, int))) {
            if (entry) /* not code, or not started yet (no line, not shown by CPython either) */
                end_run(stack, &run_start);
            continue;
        }
        if (stack->python_count >= OTEL_GPU_MAX_PYTHON_FRAMES) {
            stack->flags |= 4;
            break;
        }
        struct otel_gpu_python_frame *out = &stack->python[stack->python_count++];
        int line = line_of(code, instr - instructions);
        out->line = line > 0 ? (uint32_t)line : 0;
        out->first_line = (uint32_t)AT(code, layout->code_firstlineno, int);
        out->name_offset = put_str(stack, AT(code, layout->code_qualname, const void *));
        out->filename_offset = put_str(stack, AT(code, layout->code_filename, const void *));
        if (entry)
            end_run(stack, &run_start);
    }
    if (stack->python_count > 0)
        stack->flags |= 1;
    return 1;
}

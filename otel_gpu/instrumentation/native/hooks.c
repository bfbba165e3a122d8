/* SPDX-License-Identifier: Apache-2.0 */
/* otel_gpu.instrumentation._hooks: SpanContextProcessor's on_start, _on_ending and on_end in C, for the SDK whose
 * internals _processor.py checks at import. The same slot writes, root attributes, device rule and per-thread state as
 * the Python methods (which stay the reference and the fallback); here without a Python frame per hook, which was most
 * of their cost. Built against the limited API of 3.10, so one .so serves CPython 3.10 to 3.13. */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "span_context.h"

typedef struct otel_gpu_span_slot *(*slot_fn)(void);

/* Interned attribute names, set once at module init. */
static PyObject *s_context, *s_parent, *s_attributes, *s_immutable, *s_dict, *s_lock, *s_maxlen, *s_max_value_len,
    *s_acquire, *s_release, *s_set_attributes, *s_state, *s_parent_context;
static PyObject *thread_local_type; /* _thread._local */
static PyObject *sixty_four, *sixteen;
static PyTypeObject *state_type;
static uint64_t last_serial; /* under the GIL */

/* What a thread keeps per Hooks object (the Python path's _ThreadState). */
typedef struct {
    PyObject_HEAD
    struct otel_gpu_span_slot *slot; /* NULL: no free slot, so this thread publishes nothing */
    volatile uint64_t *devices;      /* the slot's device mask, set by the injected CUDA library */
    uint64_t root;                   /* the thread's local root span id, 0 outside one or while dark */
    PyObject *roots;                 /* the local roots open on this thread: a list of their span ids (ints) */
    int dark;                        /* more than one local root is open: the thread publishes nothing */
    PyObject *trace;                 /* the last trace id started on this thread (an int), and its two halves: */
    uint64_t trace_hi, trace_lo;     /* converted once per trace, not per span */
    PyObject *tid;                   /* the thread's kernel tid, the thread.id attribute */
} State;

typedef struct {
    PyObject_HEAD
    uint64_t serial; /* unique per Hooks and per fork: tags the per-thread cache below */
    PyObject *local; /* threading.local: .state is this thread's State */
    PyObject *pid;
    slot_fn claim;
    uintptr_t slots, devices; /* the table's first slot and the device masks beside it */
    PyObject *attributes_type;
    PyObject *profile_key, *pid_key, *tid_key, *devices_key;
} Hooks;

/* The State last used on this OS thread, borrowed from a Hooks' threading.local. It is valid while the Hooks serial
 * and the Python thread state's unique id both match: the local keeps the State for as long as that thread state lives
 * (a thread that attaches and detaches through PyGILState gets a new id each time) and the Hooks lives (serials are
 * never reused; a fork takes a new one and a new local). */
static __thread struct {
    uint64_t serial, thread_state_id;
    State *state;
} cache;

static void state_dealloc(PyObject *self) {
    State *st = (State *)self;
    Py_XDECREF(st->trace);
    Py_XDECREF(st->tid);
    Py_XDECREF(st->roots);
    PyTypeObject *tp = Py_TYPE(self);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static PyType_Slot state_slots[] = {{Py_tp_dealloc, state_dealloc}, {0, NULL}};
static PyType_Spec state_spec = {"otel_gpu.instrumentation._hooks.ThreadState", sizeof(State), 0, Py_TPFLAGS_DEFAULT,
                                 state_slots};

static State *new_state(Hooks *self) {
    State *st = PyObject_New(State, state_type);
    if (!st)
        return NULL;
    st->slot = self->claim();
    st->devices = st->slot ? (uint64_t *)self->devices + (st->slot - (struct otel_gpu_span_slot *)self->slots) : NULL;
    st->root = 0;
    st->roots = PyList_New(0);
    st->dark = 0;
    st->trace = PyLong_FromLong(0);
    st->trace_hi = st->trace_lo = 0;
    st->tid = PyLong_FromLong(syscall(SYS_gettid));
    if (!st->roots || !st->trace || !st->tid) {
        Py_DECREF(st);
        return NULL;
    }
    return st;
}

/* This thread's State (borrowed), made and its slot claimed on first use when `create`; NULL with no error set when
 * there is none and `create` is 0. */
static State *thread_state(Hooks *self, int create) {
    uint64_t id = PyThreadState_GetID(PyThreadState_Get());
    if (cache.serial == self->serial && cache.thread_state_id == id)
        return cache.state;
    PyObject *st = PyObject_GetAttr(self->local, s_state);
    if (!st) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        if (!create)
            return NULL;
        if (!(st = (PyObject *)new_state(self)))
            return NULL;
        if (PyObject_SetAttr(self->local, s_state, st) < 0) {
            Py_DECREF(st);
            return NULL;
        }
    }
    Py_DECREF(st); /* the local holds it */
    cache.serial = self->serial;
    cache.thread_state_id = id;
    cache.state = (State *)st;
    return cache.state;
}

/* A 128-bit trace id's halves; OverflowError (as int.to_bytes(16) raises) outside 0 .. 2**128 - 1. */
static int trace_halves(PyObject *trace, uint64_t *hi, uint64_t *lo) {
    PyObject *high = PyNumber_Rshift(trace, sixty_four);
    if (!high)
        return -1;
    *hi = PyLong_AsUnsignedLongLong(high);
    Py_DECREF(high);
    if (*hi == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    *lo = PyLong_AsUnsignedLongLongMask(trace);
    return *lo == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static int u64(PyObject *value, uint64_t *out) {
    *out = PyLong_AsUnsignedLongLong(value);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* getattr(obj, name, None) as a new reference; NULL only on an error other than AttributeError. */
static PyObject *attr_or_none(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return value;
    PyErr_Clear();
    Py_INCREF(Py_None);
    return Py_None;
}

/* lock.acquire(); items[key] = value for each pair; lock.release() (also on error). */
static int store_locked(PyObject *lock, PyObject *items, PyObject **keys, PyObject **values, int n) {
    PyObject *r = PyObject_CallMethodObjArgs(lock, s_acquire, NULL);
    if (!r)
        return -1;
    Py_DECREF(r);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = PyObject_SetItem(items, keys[i], values[i]);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    r = PyObject_CallMethodObjArgs(lock, s_release, NULL);
    if (!r) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(traceback);
        return -1;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, traceback);
    return rc;
}

/* 1 when the three root attributes fit unchanged (the Python path's _set_root_attributes conditions), 0 when not,
 * -1 on error. */
static int root_attributes_fit(Hooks *self, PyObject *attributes, PyObject *items) {
    int fit = 1;
    PyObject *maxlen = PyObject_GetAttr(attributes, s_maxlen);
    if (!maxlen)
        return -1;
    if (maxlen != Py_None) {
        Py_ssize_t n = PyObject_Size(items);
        PyObject *needed = n < 0 ? NULL : PyLong_FromSsize_t(n + 3);
        fit = needed ? PyObject_RichCompareBool(needed, maxlen, Py_LE) : -1;
        Py_XDECREF(needed);
    }
    Py_DECREF(maxlen);
    if (fit != 1)
        return fit;
    PyObject *max_value_len = PyObject_GetAttr(attributes, s_max_value_len);
    if (!max_value_len)
        return -1;
    if (max_value_len != Py_None)
        fit = PyObject_RichCompareBool(max_value_len, sixteen, Py_GE);
    Py_DECREF(max_value_len);
    PyObject *keys[] = {self->profile_key, self->pid_key, self->tid_key};
    for (int i = 0; i < 3 && fit == 1; i++) {
        int in = PySequence_Contains(items, keys[i]);
        fit = in < 0 ? -1 : !in;
    }
    return fit;
}

/* pyroscope.profile.id, process.pid and thread.id on a local root: stored directly where the SDK would store them
 * unchanged, else through span.set_attributes (see _processor.py's _set_root_attributes). */
static int set_root_attributes(Hooks *self, State *st, PyObject *span, uint64_t root) {
    static const char hex[] = "0123456789abcdef";
    char text[16];
    for (int i = 0; i < 16; i++)
        text[i] = hex[(root >> (60 - 4 * i)) & 0xf];
    PyObject *profile_id = PyUnicode_FromStringAndSize(text, 16);
    if (!profile_id)
        return -1;
    PyObject *keys[] = {self->profile_key, self->pid_key, self->tid_key};
    PyObject *values[] = {profile_id, self->pid, st->tid};
    int rc = -1, done = 0;
    PyObject *attributes = attr_or_none(span, s_attributes);
    if (!attributes)
        goto out;
    if ((PyObject *)Py_TYPE(attributes) == self->attributes_type) {
        PyObject *immutable = PyObject_GetAttr(attributes, s_immutable);
        int frozen = immutable ? PyObject_IsTrue(immutable) : -1;
        Py_XDECREF(immutable);
        PyObject *items = frozen == 0 ? PyObject_GetAttr(attributes, s_dict) : NULL;
        int fit = items ? root_attributes_fit(self, attributes, items) : -1;
        if (frozen < 0 || (frozen == 0 && fit < 0)) {
            Py_XDECREF(items);
            goto out;
        }
        if (fit == 1) {
            PyObject *lock = PyObject_GetAttr(attributes, s_lock);
            rc = lock ? store_locked(lock, items, keys, values, 3) : -1;
            Py_XDECREF(lock);
            done = 1;
        }
        Py_XDECREF(items);
    }
    if (!done) {
        PyObject *dict = PyDict_New();
        for (int i = 0; dict && i < 3; i++)
            if (PyDict_SetItem(dict, keys[i], values[i]) < 0)
                Py_CLEAR(dict);
        PyObject *r = dict ? PyObject_CallMethodObjArgs(span, s_set_attributes, dict, NULL) : NULL;
        Py_XDECREF(dict);
        rc = r ? 0 : -1;
        Py_XDECREF(r);
    }
out:
    Py_XDECREF(attributes);
    Py_DECREF(profile_id);
    return rc;
}

static PyObject *hooks_on_start(Hooks *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nargs < 1 || nargs + nkw > 2 ||
        (nkw == 1 && PyTuple_GetItem(kwnames, 0) != s_parent_context &&
         PyUnicode_Compare(PyTuple_GetItem(kwnames, 0), s_parent_context) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "on_start(span, parent_context=None)");
        return NULL;
    }
    State *st = thread_state(self, 1);
    if (!st)
        return NULL;
    Py_INCREF(st); /* setting attributes runs the SDK's code */
    PyObject *span = args[0], *parent = NULL, *result = NULL;
    PyObject *context = PyObject_GetAttr(span, s_context);
    if (!context || !(parent = PyObject_GetAttr(span, s_parent)))
        goto out;
    PyObject *trace = PyTuple_GetItem(context, 0), *span_obj = PyTuple_GetItem(context, 1);
    if (!trace || !span_obj)
        goto out;
    int local_root = 1;
    if (parent != Py_None) {
        PyObject *is_remote = PyTuple_GetItem(parent, 2);
        if (!is_remote || (local_root = PyObject_IsTrue(is_remote)) < 0)
            goto out;
    }
    uint64_t span_id;
    if (u64(span_obj, &span_id) < 0)
        goto out;
    uint64_t root = local_root ? span_id : st->root; /* read before the SDK's code runs, as the Python hook does */
    if (local_root) {
        if (PyList_Append(st->roots, span_obj) < 0 || set_root_attributes(self, st, span, span_id) < 0)
            goto out;
        if (st->devices)
            *st->devices = 0; /* the injected library notes this root's sampled launches from here on */
        if (PyList_Size(st->roots) > 1) { /* another local root is open here: which one a sample is in is unknown */
            st->dark = 1;
            st->root = 0;
            if (st->slot)
                otel_gpu_span_slot_write(st->slot, 0, 0, 0, 0);
            goto done;
        }
        st->root = span_id;
    } else if (st->dark) {
        goto done;
    }
    if (st->slot) {
        int same = trace == st->trace ? 1 : PyObject_RichCompareBool(trace, st->trace, Py_EQ);
        if (same < 0)
            goto out;
        if (!same) { /* a new trace on this thread: convert its id once, not per span */
            uint64_t hi, lo;
            if (trace_halves(trace, &hi, &lo) < 0)
                goto out;
            Py_INCREF(trace);
            Py_DECREF(st->trace);
            st->trace = trace;
            st->trace_hi = hi, st->trace_lo = lo;
        }
        otel_gpu_span_slot_write(st->slot, st->trace_hi, st->trace_lo, span_id, root);
    }
done:
    Py_INCREF(Py_None);
    result = Py_None;
out:
    Py_XDECREF(context);
    Py_XDECREF(parent);
    Py_DECREF(st);
    return result;
}

/* The devices of the local root's sampled launches onto it, as _processor.py's _on_ending puts them. */
static PyObject *hooks_on_ending(Hooks *self, PyObject *span) {
    State *st = thread_state(self, 0);
    if (!st) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    uint64_t mask = st->devices ? *st->devices : 0;
    if (!mask) /* most spans: nothing sampled on this thread since its local root started */
        Py_RETURN_NONE;
    PyObject *context = PyObject_GetAttr(span, s_context);
    PyObject *span_obj = context ? PyTuple_GetItem(context, 1) : NULL;
    uint64_t span_id;
    int rc = span_obj ? u64(span_obj, &span_id) : -1;
    Py_XDECREF(context);
    if (rc < 0)
        return NULL;
    if (st->root != span_id) /* a child, or a root another trace's root interrupted */
        Py_RETURN_NONE;
    PyObject *attributes = attr_or_none(span, s_attributes);
    if (!attributes)
        return NULL;
    if ((PyObject *)Py_TYPE(attributes) != self->attributes_type) {
        Py_DECREF(attributes);
        Py_RETURN_NONE;
    }
    PyObject *lock = PyObject_GetAttr(attributes, s_lock), *items = NULL, *maxlen = NULL, *devices = NULL;
    PyObject *r = lock ? PyObject_CallMethodObjArgs(lock, s_acquire, NULL) : NULL;
    if (!r)
        goto fail;
    Py_DECREF(r);
    rc = -1;
    if (!(items = PyObject_GetAttr(attributes, s_dict)))
        goto release;
    int taken = PySequence_Contains(items, self->devices_key);
    if (taken < 0)
        goto release;
    if (!taken && !(maxlen = PyObject_GetAttr(attributes, s_maxlen)))
        goto release;
    if (!taken && maxlen != Py_None) {
        Py_ssize_t n = PyObject_Size(items);
        PyObject *count = n < 0 ? NULL : PyLong_FromSsize_t(n);
        taken = count ? PyObject_RichCompareBool(count, maxlen, Py_GE) : -1; /* full */
        Py_XDECREF(count);
        if (taken < 0)
            goto release;
    }
    if (taken) {
        rc = 0;
        goto release;
    }
    if (!(devices = PyTuple_New(__builtin_popcountll(mask))))
        goto release;
    for (Py_ssize_t i = 0, d = 0; d < 64 && mask >> d; d++) {
        if (!(mask >> d & 1))
            continue;
        PyObject *ordinal = PyLong_FromSsize_t(d);
        if (!ordinal || PyTuple_SetItem(devices, i++, ordinal) < 0)
            goto release;
    }
    rc = PyObject_SetItem(items, self->devices_key, devices);
release:;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    r = PyObject_CallMethodObjArgs(lock, s_release, NULL);
    if (!r) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(traceback);
        rc = -1;
    } else {
        Py_DECREF(r);
        PyErr_Restore(type, value, traceback);
    }
    Py_XDECREF(items);
    Py_XDECREF(maxlen);
    Py_XDECREF(devices);
    Py_DECREF(lock);
    Py_DECREF(attributes);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_XDECREF(lock);
    Py_DECREF(attributes);
    return NULL;
}

/* The ended local root out of the thread's open ones (the first entry with its id; none if it started elsewhere). */
static int forget_root(State *st, PyObject *span) {
    PyObject *context = PyObject_GetAttr(span, s_context);
    PyObject *span_obj = context ? PyTuple_GetItem(context, 1) : NULL;
    uint64_t ended = 0, id;
    int rc = span_obj ? u64(span_obj, &ended) : -1;
    Py_XDECREF(context);
    for (Py_ssize_t i = 0, n = PyList_Size(st->roots); rc == 0 && i < n; i++) {
        if ((rc = u64(PyList_GetItem(st->roots, i), &id)) == 0 && id == ended)
            return PyList_SetSlice(st->roots, i, i + 1, NULL);
    }
    return rc;
}

static PyObject *hooks_on_end(Hooks *self, PyObject *span) {
    State *st = thread_state(self, 1);
    if (!st)
        return NULL;
    if (!st->slot)
        Py_RETURN_NONE;
    PyObject *parent = PyObject_GetAttr(span, s_parent);
    if (!parent)
        return NULL;
    PyObject *result = NULL;
    int is_remote = 1;
    PyObject *trace = NULL, *span_obj = NULL;
    if (parent != Py_None) {
        PyObject *remote = PyTuple_GetItem(parent, 2);
        trace = PyTuple_GetItem(parent, 0), span_obj = PyTuple_GetItem(parent, 1);
        if (!remote || !trace || !span_obj || (is_remote = PyObject_IsTrue(remote)) < 0)
            goto out;
    }
    if (is_remote) { /* a local root ended (no parent, or a remote one) */
        if (forget_root(st, span) < 0)
            goto out;
        Py_ssize_t open = PyList_Size(st->roots);
        if (open == 1) { /* down to one: its spans publish again from their next start or end */
            if (u64(PyList_GetItem(st->roots, 0), &st->root) < 0)
                goto out;
            if (st->dark && st->devices)
                *st->devices = 0; /* it gets the devices of launches made while it is alone again */
        } else if (open == 0) { /* the thread is in no span now */
            st->root = 0;
        } else { /* still more than one: nothing published */
            goto done;
        }
        st->dark = 0;
        otel_gpu_span_slot_write(st->slot, 0, 0, 0, 0);
    } else if (st->dark) {
        goto done;
    } else {
        uint64_t span_id, hi = st->trace_hi, lo = st->trace_lo;
        if (u64(span_obj, &span_id) < 0)
            goto out;
        int same = trace == st->trace ? 1 : PyObject_RichCompareBool(trace, st->trace, Py_EQ);
        if (same < 0 || (!same && trace_halves(trace, &hi, &lo) < 0)) /* spans of two traces interleaved */
            goto out;
        otel_gpu_span_slot_write(st->slot, hi, lo, span_id, st->root);
    }
done:
    Py_INCREF(Py_None);
    result = Py_None;
out:
    Py_DECREF(parent);
    return result;
}

/* The calling thread's record cleared (the processor's shutdown). */
static PyObject *hooks_shutdown(Hooks *self, PyObject *unused) {
    (void)unused;
    State *st = thread_state(self, 1);
    if (!st)
        return NULL;
    if (st->slot)
        otel_gpu_span_slot_write(st->slot, 0, 0, 0, 0);
    Py_RETURN_NONE;
}

/* In a forked child: the new pid, and every thread's state (tid, slot) made afresh on its next span. */
static PyObject *hooks_forked(Hooks *self, PyObject *pid) {
    PyObject *local = PyObject_CallNoArgs(thread_local_type);
    if (!local)
        return NULL;
    Py_INCREF(pid);
    Py_DECREF(self->pid);
    self->pid = pid;
    Py_DECREF(self->local); /* its States go with it: a tid and a slot of the parent's */
    self->local = local;
    self->serial = ++last_serial;
    Py_RETURN_NONE;
}

static PyObject *hooks_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"claim_address", "slots_address", "devices_address", "pid", "attributes_type",
                            "profile_key", "pid_key", "tid_key", "devices_key", NULL};
    unsigned long long claim, slots, devices;
    PyObject *pid, *attributes_type, *keys[4];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKOOUUUU", names, &claim, &slots, &devices, &pid,
                                     &attributes_type, &keys[0], &keys[1], &keys[2], &keys[3]))
        return NULL;
    if (!claim || !slots || !devices) {
        PyErr_SetString(PyExc_ValueError, "the table's addresses must not be 0");
        return NULL;
    }
    Hooks *self = (Hooks *)((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
    if (!self)
        return NULL;
    if (!(self->local = PyObject_CallNoArgs(thread_local_type))) {
        Py_DECREF(self);
        return NULL;
    }
    self->serial = ++last_serial;
    self->claim = (slot_fn)(uintptr_t)claim;
    self->slots = (uintptr_t)slots, self->devices = (uintptr_t)devices;
    Py_INCREF(pid), Py_INCREF(attributes_type);
    self->pid = pid, self->attributes_type = attributes_type;
    PyObject **fields[] = {&self->profile_key, &self->pid_key, &self->tid_key, &self->devices_key};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(keys[i]);
        *fields[i] = keys[i];
    }
    return (PyObject *)self;
}

static void hooks_dealloc(PyObject *op) {
    Hooks *self = (Hooks *)op;
    Py_XDECREF(self->local);
    Py_XDECREF(self->pid);
    Py_XDECREF(self->attributes_type);
    Py_XDECREF(self->profile_key);
    Py_XDECREF(self->pid_key);
    Py_XDECREF(self->tid_key);
    Py_XDECREF(self->devices_key);
    PyTypeObject *tp = Py_TYPE(op);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(op);
    Py_DECREF(tp);
}

static PyMethodDef hooks_methods[] = {
    {"on_start", (PyCFunction)(void (*)(void))hooks_on_start, METH_FASTCALL | METH_KEYWORDS,
     "on_start(span, parent_context=None): publishes the span as its thread's active one."},
    {"_on_ending", (PyCFunction)hooks_on_ending, METH_O, "_on_ending(span): a local root's sampled devices onto it."},
    {"on_end", (PyCFunction)hooks_on_end, METH_O, "on_end(span): publishes the span's local parent, or nothing."},
    {"shutdown", (PyCFunction)hooks_shutdown, METH_NOARGS, "shutdown(): clears the calling thread's record."},
    {"forked", (PyCFunction)hooks_forked, METH_O, "forked(pid): start afresh in a forked child."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot hooks_slots[] = {
    {Py_tp_new, hooks_new},
    {Py_tp_dealloc, hooks_dealloc},
    {Py_tp_methods, hooks_methods},
    {Py_tp_doc, "Hooks(claim_address, slots_address, devices_address, pid, attributes_type, profile_key, pid_key, "
                "tid_key, devices_key): a SpanContextProcessor's hooks over one span context table."},
    {0, NULL},
};
static PyType_Spec hooks_spec = {"otel_gpu.instrumentation._hooks.Hooks", sizeof(Hooks), 0, Py_TPFLAGS_DEFAULT,
                                 hooks_slots};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_gpu.instrumentation._hooks",
    "SpanContextProcessor's hooks in C (the limited API of CPython 3.10, one .so for 3.10 to 3.13).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hooks(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_context, "_context"},     {&s_parent, "_parent"},   {&s_attributes, "_attributes"},
        {&s_immutable, "_immutable"}, {&s_dict, "_dict"},       {&s_lock, "_lock"},
        {&s_maxlen, "maxlen"},        {&s_max_value_len, "max_value_len"},
        {&s_acquire, "acquire"},      {&s_release, "release"},  {&s_set_attributes, "set_attributes"},
        {&s_state, "state"},          {&s_parent_context, "parent_context"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!*names[i].slot && !(*names[i].slot = PyUnicode_InternFromString(names[i].text)))
            return NULL;
    if (!sixty_four && !(sixty_four = PyLong_FromLong(64)))
        return NULL;
    if (!sixteen && !(sixteen = PyLong_FromLong(16)))
        return NULL;
    if (!thread_local_type) {
        PyObject *thread = PyImport_ImportModule("_thread");
        if (!thread)
            return NULL;
        thread_local_type = PyObject_GetAttrString(thread, "_local");
        Py_DECREF(thread);
        if (!thread_local_type)
            return NULL;
    }
    if (!state_type && !(state_type = (PyTypeObject *)PyType_FromSpec(&state_spec)))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PyObject *hooks_type = PyType_FromSpec(&hooks_spec);
    if (!hooks_type || PyModule_AddObjectRef(m, "Hooks", hooks_type) < 0) {
        Py_XDECREF(hooks_type);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(hooks_type);
    return m;
}

/* The recorder's hot path in C: one wrapped torch.distributed call, recorded.
 *
 * wrappers.py defines what a recorded call does (in Python: _recorded_call);
 * this file does the same for the common case only and hands every other case
 * to that Python code before anything is consumed: a first sighting of an op,
 * call site, shape, reduce op or thread (interning writes the side table), a
 * caller inside torch or hctool, an unknown group, a list of tensors, arguments
 * it does not bind plainly. So a program leaves the same trace with or without
 * this module (tests/consensus/test_fastpath.py compares them); only the cost
 * differs. What the common case costs is mostly lookups, so each hook keeps
 * the ids of its last call (op, site, shape, group, reduce op, thread), checked
 * by identity, and the recorder's tables are re-read only when reset() renews them.
 *
 * The record layout is records.py's CALL ("<BBHIIIIIIiqdd8x", 64 bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define RECORD_SIZE 64
#define PER_SEGMENT ((1 << 20) / RECORD_SIZE)
#define T_DONE_OFFSET 48
#define KIND_CALL 1
#define STATE_ENTERED 1
#define STATE_COMPLETED 2
#define FLAG_ASYNC 1
#define NO_ROOT (-1)
#define MAX_PARAMS 32
#define MAX_ROOTS 4
#define SLOW (-1)

/* Bound once by wrappers.py (bind()): the recorder's state and helpers. */
static PyObject *S;          /* tracefile._S */
static PyObject *inside;     /* wrappers._inside: threads inside a recorded call */
static PyObject *guards;     /* thread id -> reusable below-autograd guard (pybind) */
static PyObject *new_guard;  /* ident -> guard */
static PyObject *grow;       /* tracefile._grow(index) -> mmap */
static PyObject *fail;       /* fail(token, exc): the call raised */
static PyObject *missing;    /* sentinel: a parameter without default */
static PyObject *void_slot;  /* recorder._void(slot): a slot taken but not filled */

/* The recorder's tables as of the last reset() (S.segs is a new list after each). */
static PyObject *snap_segs, *snap_slots, *snap_groups, *snap_op, *snap_site, *snap_desc, *snap_th,
    *snap_code_internal, *snap_ro_by_id;
static unsigned long snap_gen = 1;
static unsigned long long n_fast, n_slow; /* calls recorded here / handed to Python (stats()) */
static volatile int forked; /* set in a forked child until snapshot() sees its renewed tables */

/* This thread's OS thread id, asked once (a system call, ~0.2 us); a forked child's thread
 * has a new one. */
static __thread unsigned long native_id;

static void after_fork_in_child(void) {
    forked = 1;
    native_id = 0;
}

/* Below autograd without pybind: c10's thread-local dispatch key set, found once
 * per thread by dlsym (set_dispatch_tls; wrappers.py checks it against torch's own
 * view before using it). Without it the pybind guard serves. */
static void *c10_handle;
static uint64_t autograd_raw, default_excluded_raw;
static __thread uint64_t *tls_excluded;

static PyObject *s_trace_dir, *s_world, *s_groups, *s_interned, *s_code_internal, *s_ro_by_id, *s_slots,
    *s_segs, *s_member, *s_id, *s_seq, *s_shape, *s_dtype, *s_op, *s_site, *s_desc, *s_th, *s_enter, *s_exit;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *op, *fn, *slow, *names, *defaults;
    Py_ssize_t nparams, npos;
    Py_ssize_t group_i, tensors_i, ro_i, async_i; /* -1: not a parameter of fn */
    int async_const;
    Py_ssize_t root_i[MAX_ROOTS];
    int nroot;
    /* the last call's ids, valid while gen == snap_gen */
    unsigned long gen;
    long opid;
    PyObject *g_obj, *g_seq; /* strong: the _Group and its counter */
    long g_id;
    int g_member;
    const void *c_code, *c_bcode; /* compared only: code objects the recorder keeps alive */
    int c_lasti, c_blasti;
    long c_site;
    PyObject *c_shape; /* strong */
    const void *c_dtype;
    long c_desc;
    const void *c_ro;
    long c_roid;
    unsigned long c_thread;
    long c_th;
} Hook;

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* dict[key] as a C long; -1 when absent (errors cleared). */
static long lookup_id(PyObject *dict, PyObject *key) {
    if (dict == NULL || key == NULL) { PyErr_Clear(); return -1; }
    PyObject *v = PyDict_GetItemWithError(dict, key); /* borrowed */
    if (v == NULL || !PyLong_Check(v)) { PyErr_Clear(); return -1; }
    long r = PyLong_AsLong(v);
    if (r <= 0) { PyErr_Clear(); return -1; }
    return r;
}

static PyObject *table(PyObject *interned, PyObject *kind) {
    PyObject *t = PyDict_GetItemWithError(interned, kind);
    if (t == NULL || !PyDict_Check(t)) return NULL;
    Py_INCREF(t);
    return t;
}

/* Re-read the recorder's tables if reset() renewed them. 0: usable. */
static int snapshot(void) {
    PyObject *segs = PyObject_GetAttr(S, s_segs);
    if (segs == NULL) return -1;
    if (segs == snap_segs) { Py_DECREF(segs); return 0; }
    PyObject *interned = PyObject_GetAttr(S, s_interned);
    PyObject *fresh[9] = {segs, PyObject_GetAttr(S, s_slots), PyObject_GetAttr(S, s_groups), NULL, NULL, NULL, NULL,
                          PyObject_GetAttr(S, s_code_internal), PyObject_GetAttr(S, s_ro_by_id)};
    if (interned != NULL && PyDict_Check(interned)) {
        fresh[3] = table(interned, s_op); fresh[4] = table(interned, s_site);
        fresh[5] = table(interned, s_desc); fresh[6] = table(interned, s_th);
    }
    Py_XDECREF(interned);
    int ok = PyList_Check(segs);
    for (int i = 1; i < 9; i++) ok = ok && fresh[i] != NULL && (i == 1 || PyDict_Check(fresh[i]));
    PyObject **dst[9] = {&snap_segs, &snap_slots, &snap_groups, &snap_op, &snap_site, &snap_desc, &snap_th,
                         &snap_code_internal, &snap_ro_by_id};
    for (int i = 0; i < 9; i++) {
        if (!ok) Py_CLEAR(fresh[i]);
        Py_XSETREF(*dst[i], fresh[i]);
    }
    snap_gen++;
    forked = 0;
    PyErr_Clear();
    return ok ? 0 : -1;
}

static void forget(Hook *h) {
    h->gen = snap_gen;
    h->opid = -1;
    Py_CLEAR(h->g_obj); Py_CLEAR(h->g_seq);
    h->c_code = NULL; h->c_site = -1;
    Py_CLEAR(h->c_shape); h->c_dtype = NULL; h->c_desc = -1;
    h->c_ro = NULL; h->c_roid = -1;
    h->c_thread = 0; h->c_th = -1;
}

/* The arguments of fn this call binds, or 0 if it must go the Python way. */
static int bind_args(Hook *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **bound) {
    if (nargs > h->npos) return 0;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < h->nparams; i++) bound[i] = i < nargs ? args[i] : NULL;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        for (; i < h->nparams; i++) {
            PyObject *p = PyTuple_GET_ITEM(h->names, i);
            if (p == name) break;
            int eq = PyUnicode_Compare(p, name);
            if (eq == 0) break;
            if (eq == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        }
        if (i == h->nparams || bound[i] != NULL) return 0; /* unknown or given twice: torch says how */
        bound[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < h->nparams; i++) {
        if (bound[i] == NULL) {
            PyObject *d = PyTuple_GET_ITEM(h->defaults, i);
            if (d == missing) return 0;
            bound[i] = d;
        }
    }
    return 1;
}

/* The group's id, membership and counter (cached per hook by _Group identity). 0: found. */
static int group_of(Hook *h, PyObject *group) {
    PyObject *g;
    if (group == Py_None) {
        g = PyObject_GetAttr(S, s_world);
    } else {
        PyObject *key = PyLong_FromVoidPtr(group);
        g = key ? PyDict_GetItemWithError(snap_groups, key) : NULL;
        Py_XINCREF(g);
        Py_XDECREF(key);
    }
    if (g == NULL || g == Py_None) { Py_XDECREF(g); return SLOW; }
    if (g == h->g_obj) { Py_DECREF(g); return 0; }
    PyObject *member = PyObject_GetAttr(g, s_member), *gid = PyObject_GetAttr(g, s_id),
             *seq = PyObject_GetAttr(g, s_seq);
    int is_member = member ? PyObject_IsTrue(member) : -1;
    long id = gid && PyLong_Check(gid) ? PyLong_AsLong(gid) : -1;
    Py_XDECREF(member); Py_XDECREF(gid);
    if (is_member < 0 || id <= 0 || seq == NULL || !PyIter_Check(seq)) { Py_DECREF(g); Py_XDECREF(seq); return SLOW; }
    Py_XSETREF(h->g_obj, g);
    Py_XSETREF(h->g_seq, seq);
    h->g_id = id;
    h->g_member = is_member;
    return 0;
}

/* The site id of the frame that called the Python wrapper (the frame running now). */
static long site_of(Hook *h) {
    PyFrameObject *cur = PyEval_GetFrame(), *f = NULL, *back = NULL;
    PyCodeObject *code = NULL, *bcode = NULL;
    PyObject *key = NULL;
    long site = SLOW;
    if (cur == NULL || (f = PyFrame_GetBack(cur)) == NULL) goto out;
    code = PyFrame_GetCode(f);
    back = PyFrame_GetBack(f);
    bcode = back ? PyFrame_GetCode(back) : NULL;
    int lasti = PyFrame_GetLasti(f), blasti = back ? PyFrame_GetLasti(back) : 0;
    if (h->c_code == code && h->c_bcode == bcode && h->c_lasti == lasti && h->c_blasti == blasti) {
        site = h->c_site;
        goto out;
    }
    PyObject *cid = PyLong_FromVoidPtr(code);
    PyObject *known = cid ? PyDict_GetItemWithError(snap_code_internal, cid) : NULL;
    Py_XDECREF(cid);
    if (known != Py_False) goto out; /* inside torch or hctool, or new: the frame walk is Python's */
    key = back ? Py_BuildValue("(NiNi)", PyLong_FromVoidPtr(code), lasti, PyLong_FromVoidPtr(bcode), blasti)
               : Py_BuildValue("(Ni)", PyLong_FromVoidPtr(code), lasti);
    site = lookup_id(snap_site, key);
    if (site > 0) {
        h->c_code = code; h->c_bcode = bcode; h->c_lasti = lasti; h->c_blasti = blasti; h->c_site = site;
    }
out:
    Py_XDECREF(key); Py_XDECREF(f); Py_XDECREF(back); Py_XDECREF(code); Py_XDECREF(bcode);
    PyErr_Clear();
    return site;
}

static long desc_of(Hook *h, PyObject *tensors) {
    if (tensors == Py_None) { /* what tracefile._desc_id keys "nothing" by (barrier) */
        PyObject *key = Py_BuildValue("(s)", "none");
        long d = lookup_id(snap_desc, key);
        Py_XDECREF(key);
        return d;
    }
    PyObject *shape = PyObject_GetAttr(tensors, s_shape), *dtype = shape ? PyObject_GetAttr(tensors, s_dtype) : NULL;
    long desc = SLOW;
    if (dtype == NULL) goto out; /* a list or an object: Python describes it */
    if (h->c_shape != NULL && h->c_dtype == dtype) {
        int eq = PyObject_RichCompareBool(shape, h->c_shape, Py_EQ);
        if (eq > 0) { desc = h->c_desc; goto out; }
        if (eq < 0) PyErr_Clear();
    }
    PyObject *key = PyTuple_Pack(2, shape, dtype);
    desc = lookup_id(snap_desc, key);
    Py_XDECREF(key);
    if (desc > 0) {
        Py_INCREF(shape);
        Py_XSETREF(h->c_shape, shape);
        h->c_dtype = dtype;
        h->c_desc = desc;
    }
out:
    Py_XDECREF(shape); Py_XDECREF(dtype);
    PyErr_Clear();
    return desc;
}

static long id_by_address(PyObject *dict, const void *p) {
    PyObject *key = PyLong_FromVoidPtr((void *)p);
    long r = lookup_id(dict, key);
    Py_XDECREF(key);
    return r;
}

static unsigned char *record_at(long long slot, int may_grow) {
    Py_ssize_t index = (Py_ssize_t)(slot / PER_SEGMENT);
    PyObject *mm;
    if (index < PyList_GET_SIZE(snap_segs)) {
        mm = PyList_GET_ITEM(snap_segs, index);
        Py_INCREF(mm);
    } else if (!may_grow || (mm = PyObject_CallFunction(grow, "n", index)) == NULL) {
        return NULL;
    }
    Py_buffer view;
    int r = PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE);
    Py_DECREF(mm);
    if (r < 0) return NULL;
    /* The pointer outlives the buffer export: the recorder never closes or resizes a segment mmap
     * while the process records (segments are only appended), and holds them in S.segs. */
    unsigned char *p = (unsigned char *)view.buf + (slot % PER_SEGMENT) * RECORD_SIZE;
    PyBuffer_Release(&view);
    return p;
}

/* The call record, as recorder._record writes it. Returns the token (slot + 1),
 * 0 for "not a member: not recorded", SLOW for "go the Python way" (nothing
 * consumed), or -(slot + 2) on an error after the slot was taken. */
static long long record(Hook *h, PyObject **bound) {
    if (snapshot() < 0) return SLOW;
    if (h->gen != snap_gen) forget(h);
    if (group_of(h, h->group_i >= 0 ? bound[h->group_i] : Py_None) < 0) return SLOW;
    if (!h->g_member) return 0; /* torch returns early for non-members */
    if (h->opid < 0 && (h->opid = lookup_id(snap_op, h->op)) < 0) return SLOW;
    long site = site_of(h);
    if (site < 0) return SLOW;
    long desc = desc_of(h, h->tensors_i >= 0 ? bound[h->tensors_i] : Py_None);
    if (desc < 0) return SLOW;
    long ro = 0;
    PyObject *rop = h->ro_i >= 0 ? bound[h->ro_i] : Py_None;
    /* A cache pair (key, id) is replaced whole, and only by a found id: a miss leaves the
     * previous pair valid for its own key (two threads alternating, one not yet interned). */
    if (rop != Py_None) {
        if (rop != h->c_ro) {
            long found = id_by_address(snap_ro_by_id, rop);
            if (found < 0) return SLOW;
            h->c_ro = rop; /* kept alive by the recorder (ro_by_id's objects) */
            h->c_roid = found;
        }
        ro = h->c_roid;
    }
    /* threads are interned by OS thread id, as tracefile._thread_id does */
    if (native_id == 0) native_id = PyThread_get_thread_native_id();
    unsigned long thread = native_id;
    if (thread != h->c_thread) {
        PyObject *native = PyLong_FromUnsignedLong(thread);
        long found = lookup_id(snap_th, native);
        Py_XDECREF(native);
        if (found < 0) return SLOW;
        h->c_thread = thread;
        h->c_th = found;
    }
    long root = NO_ROOT;
    for (int i = 0; i < h->nroot; i++) {
        PyObject *r = bound[h->root_i[i]];
        if (r == Py_None) continue;
        if (!PyLong_Check(r)) return SLOW;
        root = PyLong_AsLong(r);
        if (PyErr_Occurred() || root < INT32_MIN || root > INT32_MAX) { PyErr_Clear(); return SLOW; }
        break;
    }
    int async_op = h->async_const;
    if (h->async_i >= 0 && (async_op = PyObject_IsTrue(bound[h->async_i])) < 0) { PyErr_Clear(); return SLOW; }

    /* Everything is known: take the sequence number and the slot. */
    PyObject *seqo = PyIter_Next(h->g_seq), *sloto = seqo ? PyIter_Next(snap_slots) : NULL;
    long long seq = seqo ? PyLong_AsLongLong(seqo) : -1, slot = sloto ? PyLong_AsLongLong(sloto) : -1;
    Py_XDECREF(seqo); Py_XDECREF(sloto);
    if (slot < 0) { PyErr_Clear(); return SLOW; }
    unsigned char *p = record_at(slot, 1);
    if (p == NULL) return -(slot + 2);
    unsigned char rec[RECORD_SIZE];
    memset(rec, 0, sizeof rec);
    uint16_t flags = async_op ? FLAG_ASYNC : 0;
    uint32_t u[6] = {(uint32_t)h->opid, (uint32_t)h->g_id, (uint32_t)site, (uint32_t)desc, (uint32_t)h->c_th,
                     (uint32_t)ro};
    int32_t root32 = (int32_t)root;
    int64_t seq64 = seq;
    double t = monotonic();
    rec[1] = STATE_ENTERED;
    memcpy(rec + 2, &flags, 2);
    memcpy(rec + 4, u, sizeof u);
    memcpy(rec + 28, &root32, 4);
    memcpy(rec + 32, &seq64, 8);
    memcpy(rec + 40, &t, 8);
    memcpy(p, rec, RECORD_SIZE);
    __atomic_store_n(p, (unsigned char)KIND_CALL, __ATOMIC_RELEASE); /* last: the record is whole */
    return slot + 1;
}

static void complete_ok(long long token) {
    if (forked) return; /* a child forked inside the call: the slot is its parent's */
    unsigned char *p = record_at(token - 1, 0);
    if (p == NULL) { PyErr_Clear(); return; }
    double t = monotonic();
    memcpy(p + T_DONE_OFFSET, &t, 8);
    __atomic_store_n(p + 1, (unsigned char)STATE_COMPLETED, __ATOMIC_RELEASE);
}

static uint64_t *excluded_word(void) {
    if (tls_excluded == NULL && c10_handle != NULL) {
        /* {included_, excluded_}: c10::impl::PODLocalDispatchKeySet (wrappers.py checks the layout) */
        uint64_t *set = (uint64_t *)dlsym(c10_handle, "_ZN3c104impl26raw_local_dispatch_key_setE");
        tls_excluded = set ? set + 1 : NULL;
    }
    return tls_excluded;
}

/* Exclude the autograd keys on this thread, as c10::impl::ExcludeDispatchKeyGuard does
 * (c10 stores the set XORed with its default); returns the keys this added. */
static uint64_t below_autograd_enter(uint64_t *w) {
    uint64_t excluded = *w ^ default_excluded_raw;
    uint64_t delta = autograd_raw & ~excluded;
    *w = (excluded | delta) ^ default_excluded_raw;
    return delta;
}

static void below_autograd_exit(uint64_t *w, uint64_t delta) {
    *w = ((*w ^ default_excluded_raw) & ~delta) ^ default_excluded_raw;
}

static PyObject *call_below_autograd(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                                     PyObject *ident) {
    uint64_t *w = c10_handle ? excluded_word() : NULL;
    if (w != NULL) {
        uint64_t delta = below_autograd_enter(w);
        PyObject *result = PyObject_Vectorcall(h->fn, args, nargsf, kwnames);
        below_autograd_exit(w, delta);
        return result;
    }
    PyObject *guard = PyDict_GetItemWithError(guards, ident);
    if (guard != NULL) Py_INCREF(guard);
    else if (PyErr_Occurred() || (guard = PyObject_CallOneArg(new_guard, ident)) == NULL) return NULL;
    PyObject *result = NULL, *entered = PyObject_CallMethodNoArgs(guard, s_enter);
    if (entered != NULL) {
        Py_DECREF(entered);
        result = PyObject_Vectorcall(h->fn, args, nargsf, kwnames);
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *exited = PyObject_CallMethodObjArgs(guard, s_exit, Py_None, Py_None, Py_None, NULL);
        if (exited == NULL) PyErr_Clear();
        Py_XDECREF(exited);
        PyErr_Restore(et, ev, etb);
    }
    Py_DECREF(guard);
    return result;
}

static PyObject *hook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Hook *h = (Hook *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *bound[MAX_PARAMS];
    if (S == NULL) return PyObject_Vectorcall(h->fn, args, nargsf, kwnames);
    PyObject *trace_dir = PyObject_GetAttr(S, s_trace_dir);
    if (trace_dir == NULL) return NULL;
    int off = trace_dir == Py_None;
    Py_DECREF(trace_dir);
    if (off) return PyObject_Vectorcall(h->fn, args, nargsf, kwnames);
    unsigned long thread = PyThread_get_thread_ident();
    PyObject *ident = PyLong_FromUnsignedLong(thread);
    if (ident == NULL) return NULL;
    int nested = PySet_Contains(inside, ident);
    if (nested != 0) { /* nested inside a recorded call (or an error): one event per user call */
        Py_DECREF(ident);
        return nested < 0 ? NULL : PyObject_Vectorcall(h->fn, args, nargsf, kwnames);
    }
    long long token = bind_args(h, args, nargs, kwnames, bound) ? record(h, bound) : SLOW;
    if (token == SLOW) { /* the Python way, from the start */
        n_slow++;
        Py_DECREF(ident);
        PyErr_Clear();
        return PyObject_Vectorcall(h->slow, args, nargsf, kwnames);
    }
    if (token < SLOW) { /* slot -token-2 was taken but not filled: readers must skip it */
        PyErr_Clear();
        PyObject *r = PyObject_CallFunction(void_slot, "L", -token - 2);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
        token = 0;
    }
    n_fast++;
    if (PySet_Add(inside, ident) < 0) { Py_DECREF(ident); return NULL; }
    PyObject *result = call_below_autograd(h, args, nargsf, kwnames, ident);
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    if (result == NULL && token > 0) {
        PyErr_NormalizeException(&et, &ev, &etb);
        PyObject *r = PyObject_CallFunction(fail, "LO", token, ev ? ev : Py_None);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
    }
    if (PySet_Discard(inside, ident) < 0) PyErr_Clear();
    PyErr_Restore(et, ev, etb);
    Py_DECREF(ident);
    if (result != NULL && token > 0) complete_ok(token);
    return result;
}

static int hook_traverse(Hook *h, visitproc visit, void *arg) {
    Py_VISIT(h->op); Py_VISIT(h->fn); Py_VISIT(h->slow); Py_VISIT(h->names); Py_VISIT(h->defaults);
    Py_VISIT(h->g_obj); Py_VISIT(h->g_seq); Py_VISIT(h->c_shape);
    return 0;
}

static int hook_clear(Hook *h) {
    Py_CLEAR(h->op); Py_CLEAR(h->fn); Py_CLEAR(h->slow); Py_CLEAR(h->names); Py_CLEAR(h->defaults);
    Py_CLEAR(h->g_obj); Py_CLEAR(h->g_seq); Py_CLEAR(h->c_shape);
    return 0;
}

static void hook_dealloc(Hook *h) {
    PyObject_GC_UnTrack(h);
    hook_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hctool.agent.capture._fastpath.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)hook_traverse,
    .tp_clear = (inquiry)hook_clear,
    .tp_dealloc = (destructor)hook_dealloc,
    .tp_doc = "A torch.distributed call, recorded (wrappers.py builds these).",
};

/* hook(op, fn, slow, names, npos, defaults, group_i, tensors_i, ro_i, async_i, async_const, roots) */
static PyObject *make_hook(PyObject *mod, PyObject *args) {
    PyObject *op, *fn, *slow, *names, *defaults, *roots;
    Py_ssize_t npos, gi, ti, ri, ai;
    int async_const;
    if (!PyArg_ParseTuple(args, "UOOO!nO!nnnnpO!", &op, &fn, &slow, &PyTuple_Type, &names, &npos, &PyTuple_Type,
                          &defaults, &gi, &ti, &ri, &ai, &async_const, &PyTuple_Type, &roots))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > MAX_PARAMS || PyTuple_GET_SIZE(defaults) != n || PyTuple_GET_SIZE(roots) > MAX_ROOTS || npos > n ||
        gi >= n || ti >= n || ri >= n || ai >= n) {
        PyErr_SetString(PyExc_ValueError, "hook: a parameter index is out of range");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "hook: parameter names must be str");
            return NULL;
        }
    Hook *h = PyObject_GC_New(Hook, &HookType);
    if (h == NULL) return NULL;
    memset((char *)h + sizeof(PyObject), 0, sizeof(Hook) - sizeof(PyObject));
    h->vectorcall = hook_vectorcall;
    Py_INCREF(op); h->op = op;
    Py_INCREF(fn); h->fn = fn;
    Py_INCREF(slow); h->slow = slow;
    Py_INCREF(names); h->names = names;
    Py_INCREF(defaults); h->defaults = defaults;
    h->nparams = n; h->npos = npos;
    h->group_i = gi; h->tensors_i = ti; h->ro_i = ri; h->async_i = ai; h->async_const = async_const;
    h->nroot = (int)PyTuple_GET_SIZE(roots);
    forget(h);
    h->gen = 0;
    for (int i = 0; i < h->nroot; i++) {
        Py_ssize_t r = PyLong_AsSsize_t(PyTuple_GET_ITEM(roots, i));
        if (r < 0 || r >= n) {
            Py_DECREF(h);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "hook: a root index is out of range");
            return NULL;
        }
        h->root_i[i] = r;
    }
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

/* bind(state, inside, guards, new_guard, grow, fail, missing, void) */
static PyObject *bind(PyObject *mod, PyObject *args) {
    PyObject *a[8];
    if (!PyArg_ParseTuple(args, "OO!O!OOOOO", &a[0], &PySet_Type, &a[1], &PyDict_Type, &a[2], &a[3], &a[4], &a[5],
                          &a[6], &a[7]))
        return NULL;
    PyObject **dst[8] = {&S, &inside, &guards, &new_guard, &grow, &fail, &missing, &void_slot};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(a[i]);
        Py_XSETREF(*dst[i], a[i]);
    }
    Py_CLEAR(snap_segs);
    Py_RETURN_NONE;
}

/* set_dispatch_tls(libc10_path, autograd_raw, default_excluded_raw) -> bool; None turns it off. */
static PyObject *set_dispatch_tls(PyObject *mod, PyObject *args) {
    PyObject *path;
    unsigned long long keys, dflt;
    if (!PyArg_ParseTuple(args, "OKK", &path, &keys, &dflt)) return NULL;
    c10_handle = NULL;
    tls_excluded = NULL;
    if (path == Py_None) Py_RETURN_FALSE;
    if (!PyUnicode_Check(path)) return PyErr_Format(PyExc_TypeError, "set_dispatch_tls: path must be str");
    void *h = dlopen(PyUnicode_AsUTF8(path), RTLD_NOLOAD | RTLD_LAZY); /* only the library torch loaded */
    if (h == NULL || dlsym(h, "_ZN3c104impl26raw_local_dispatch_key_setE") == NULL) Py_RETURN_FALSE;
    autograd_raw = keys;
    default_excluded_raw = dflt;
    c10_handle = h;
    Py_RETURN_TRUE;
}

/* The raw excluded word of this thread (for wrappers.py's check), or None. */
static PyObject *excluded_raw(PyObject *mod, PyObject *noargs) {
    uint64_t *w = excluded_word();
    if (w == NULL) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(*w);
}

/* below_autograd(fn): fn() with the autograd keys excluded as the hooks do (for the check). */
static PyObject *below_autograd(PyObject *mod, PyObject *fn) {
    uint64_t *w = excluded_word();
    if (w == NULL) return PyErr_Format(PyExc_RuntimeError, "below_autograd: no dispatch TLS");
    uint64_t delta = below_autograd_enter(w);
    PyObject *r = PyObject_CallNoArgs(fn);
    below_autograd_exit(w, delta);
    return r;
}

static PyObject *stats(PyObject *mod, PyObject *noargs) {
    return Py_BuildValue("{sKsKsO}", "fast", n_fast, "python", n_slow, "dispatch_tls",
                         c10_handle ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"stats", stats, METH_NOARGS, "Calls the hooks recorded here and calls they handed to Python."},
    {"hook", make_hook, METH_VARARGS, "A recorded call of fn (see wrappers.py)."},
    {"bind", bind, METH_VARARGS, "The recorder state and helpers the hooks use."},
    {"set_dispatch_tls", set_dispatch_tls, METH_VARARGS, "Use c10's dispatch TLS directly (see wrappers.py)."},
    {"excluded_raw", excluded_raw, METH_NOARGS, "This thread's raw excluded dispatch key word."},
    {"below_autograd", below_autograd, METH_O, "fn() below autograd, as the hooks call torch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", "The recorder's hot path in C.", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    struct { PyObject **p; const char *s; } strs[] = {
        {&s_trace_dir, "trace_dir"}, {&s_world, "world"}, {&s_groups, "groups"}, {&s_interned, "interned"},
        {&s_code_internal, "code_internal"}, {&s_ro_by_id, "ro_by_id"}, {&s_slots, "slots"}, {&s_segs, "segs"},
        {&s_member, "member"}, {&s_id, "id"}, {&s_seq, "seq"}, {&s_shape, "shape"}, {&s_dtype, "dtype"},
        {&s_op, "op"}, {&s_site, "site"}, {&s_desc, "desc"}, {&s_th, "th"}, {&s_enter, "__enter__"},
        {&s_exit, "__exit__"},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if ((*strs[i].p = PyUnicode_InternFromString(strs[i].s)) == NULL) return NULL;
    if (PyType_Ready(&HookType) < 0) return NULL;
    pthread_atfork(NULL, NULL, after_fork_in_child);
    return PyModule_Create(&module);
}

/*
 * _fastpath.c -- the hot path of cgraph's shared-memory channel, in C.
 *
 * Why C. One small hop through shm_channel.py in pure Python costs ~5 us, and
 * almost none of it is the work itself: three ctypes semaphore calls (~0.35 us
 * each), the Payload record and struct packing, slot lookups and a dozen
 * Python frames. The channel carries mostly small values (an actor method's
 * ``((args...), {kwargs})``, ints, short strings), so that overhead is the hop.
 * This module does a whole small-value write, and a whole read and release,
 * in one C call each, and gives the Python code C versions of the three
 * semaphore primitives it uses on every other path.
 *
 * What it is. Module functions ``sem_post``, ``sem_trywait`` and ``sem_wait``
 * take the address of a process-shared ``sem_t`` (semaphore.py uses them in
 * place of ctypes). The ``Endpoint`` type is one writer's or one reader's C
 * core: it holds the control segment's words (a memoryview, so the mapping
 * stays alive) and the endpoint's two slot lists (``_SlotMaps.gens`` and
 * ``.views``: the generation and the memoryview this process maps per slot),
 * shared with Python, never copied.
 *
 *     Endpoint.write(value, timeout)      Endpoint.read(timeout, copy)
 *       small plain value? else MISS        post the held slot's free token
 *       b = pickle.dumps(value, 5)          closed? -> MISS (CLOSED)
 *       slot mapped and big enough?         take ready[r] (may sleep, GIL off)
 *         else MISS (FALLBACK)              closed? -> MISS (CLOSED)
 *       take free[r] for every reader       reader seq += 1, hold the slot
 *         (may sleep, GIL off)              slot mapped, no out-of-band
 *       header + b into the slot              buffers? else MISS (DECODE)
 *       slot table, writer seq              pickle.loads(the slot's bytes)
 *       post ready[r] for every reader      copy=True: release at once
 *
 * Everything rare returns the ``MISS`` sentinel with ``status`` saying why,
 * and shm_channel.py finishes the job in Python: values that need the
 * out-of-band pickler (arrays, tensors, anything not a small plain value), a
 * slot that must grow or be mapped, slots holding out-of-band buffers, a
 * closed channel, a failed wait (the errors are Python's).
 *
 * Interop. Same control layout, same semaphores, same slot bytes (u64 pickle
 * length, u64 buffer count 0, pickle protocol 5 bytes) as shm_channel.py and
 * serialization.py, and the endpoint's state that both paths use (the writer
 * and reader sequence numbers) lives in the shared words, so a C endpoint and
 * a pure-Python endpoint of one channel interoperate, in one process or
 * across processes. ``LAYOUT`` lists the constants below; a test compares it
 * with the Python ones. Every shared word still has one writer process, and
 * sem_post / sem_trywait order the memory (volatile only keeps the compiler
 * from caching words another process changes).
 *
 * The slot memory stays mapped while C touches it: C holds a reference to the
 * slot's memoryview, which holds the mmap; Python never closes a mapping, it
 * only drops it. No buffer export is held between calls, so nothing here
 * stops an mmap from being dropped. Waits release the GIL, sleep at most
 * ``poll_ns`` at a time in sem_clockwait(CLOCK_MONOTONIC), re-check the
 * channel's ``closed`` word between sleeps, and run Python's signal handlers
 * on EINTR, so Ctrl-C still interrupts a blocked endpoint.
 *
 * Disable with CGRAPH_PURE_PYTHON=1 (read when cgraph.channels is imported);
 * a missing or broken build falls back to Python by itself.
 * Needs glibc >= 2.30 (sem_clockwait) and a little-endian host.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <math.h>
#include <semaphore.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "slot headers are little-endian u64s and this file stores native words"
#endif

/* ---------------------------------------------------------------- layout
 * Keep in step with shm_channel.py and serialization.py (LAYOUT, tested). */
#define MAGIC 0x4C4E484348504743ULL /* "CGPHCHNL" */
#define VERSION 1
#define W_MAGIC 0
#define W_VERSION 1
#define W_READERS 2
#define W_INFLIGHT 3
#define W_CLOSED 4
#define W_WSEQ 6
#define W_SLOTS 8      /* slot table: SLOT_WORDS words per slot, then reader seqs */
#define SLOT_WORDS 4   /* gen, capacity, nbytes, seq */
#define SEM_STRIDE 64  /* reader r: ready sem at 2r strides, free sem one later */
#define HEAD_BYTES 16  /* slot data: u64 pickle length, u64 buffer count */
#define SMALL_LEN 8    /* serialization._is_small_plain: at most 8 entries, */
#define SMALL_DEPTH 2  /* two levels of tuple / list / dict */

#define NS_PER_S 1000000000LL
#define NO_DEADLINE (-1)

enum { ACQUIRED = 0, TIMED_OUT = 1, STOPPED = 2 }; /* what a wait ended with */
enum { ST_DONE = 0, ST_FALLBACK = 1, ST_WAIT_FAILED = 2, ST_CLOSED = 3, ST_DECODE = 4 };

static PyObject *pickle_dumps; /* pickle.dumps, called through vectorcall */
static PyObject *pickle_loads;
static PyObject *protocol_5;
static PyObject *miss; /* the sentinel an Endpoint returns when Python must finish */

/* ---------------------------------------------------------------- helpers */
static int64_t
monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * NS_PER_S + now.tv_nsec;
}

/* ``timeout`` (seconds or None) as an absolute CLOCK_MONOTONIC deadline, the
 * clock of time.monotonic_ns(). Returns 0, or -1 with an exception set. */
static int
deadline_after(PyObject *timeout, int64_t *deadline)
{
    if (timeout == NULL || timeout == Py_None) {
        *deadline = NO_DEADLINE;
        return 0;
    }
    double seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred())
        return -1;
    if (isnan(seconds)) {
        PyErr_SetString(PyExc_ValueError, "timeout is NaN");
        return -1;
    }
    int64_t now = monotonic_ns();
    if (seconds > 1e9) /* decades: the same as no deadline, and no overflow */
        *deadline = NO_DEADLINE;
    else
        *deadline = seconds <= 0 ? now : now + (int64_t)(seconds * 1e9);
    return 0;
}

/* Argument count in [least, most], else TypeError. */
static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most)
{
    if (nargs >= least && nargs <= most)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd arguments (%zd given)", name, least,
                 most, nargs);
    return 0;
}

static void *
address_of(PyObject *address)
{
    void *ptr = PyLong_AsVoidPtr(address);
    if (ptr == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "null semaphore address");
    return ptr;
}

/* should_stop() as a C truth value: 1, 0, or -1 with an exception set. */
static int
ask(PyObject *should_stop)
{
    PyObject *answer = PyObject_CallNoArgs(should_stop);
    if (answer == NULL)
        return -1;
    int stop = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return stop;
}

/* Take one token of ``sem``, sleeping in the kernel with the GIL released.
 *
 * Sleeps at most ``poll_ns`` at a time. Before every sleep it stops if the
 * word ``stop_word`` (when not NULL) is non-zero or ``should_stop()`` (when not
 * NULL; called with the GIL) is true, so a lost wake-up delays a waiter by one
 * poll period at most. EINTR runs Python's signal handlers: one that raises
 * (KeyboardInterrupt) ends the wait with its exception.
 *
 * Returns ACQUIRED, TIMED_OUT or STOPPED; -1 with an exception set. */
static int
wait_sem(sem_t *sem, int64_t deadline, int64_t poll_ns,
         volatile const uint64_t *stop_word, PyObject *should_stop)
{
    if (sem_trywait(sem) == 0)
        return ACQUIRED;
    int result;
    PyThreadState *thread = PyEval_SaveThread();
    for (;;) {
        if (stop_word != NULL && *stop_word != 0) {
            result = STOPPED;
            break;
        }
        if (should_stop != NULL) {
            PyEval_RestoreThread(thread);
            int stop = ask(should_stop);
            if (stop != 0)
                return stop < 0 ? -1 : STOPPED;
            thread = PyEval_SaveThread();
        }
        int64_t now = monotonic_ns();
        if (deadline != NO_DEADLINE && now >= deadline) {
            result = TIMED_OUT;
            break;
        }
        int64_t until = now + poll_ns;
        if (deadline != NO_DEADLINE && deadline < until)
            until = deadline;
        struct timespec at = {(time_t)(until / NS_PER_S), (long)(until % NS_PER_S)};
        if (sem_clockwait(sem, CLOCK_MONOTONIC, &at) == 0) {
            result = ACQUIRED;
            break;
        }
        int err = errno;
        if (err == ETIMEDOUT)
            continue;
        PyEval_RestoreThread(thread);
        if (err != EINTR) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;
        thread = PyEval_SaveThread();
    }
    PyEval_RestoreThread(thread);
    return result;
}

/* ``value`` takes serialization.dumps' fast path: an exact int, float,
 * complex, bool, str, bytes or None, or a tuple / list / dict (str keys) of at
 * most SMALL_LEN of them, nested at most ``depth`` deep. Such a value has no
 * out-of-band buffers and no custom reducer, so plain pickle.dumps(v, 5) is
 * exactly what the Python path writes. Mirrors _is_small_plain: keep in step. */
static int
is_small_plain(PyObject *value, int depth)
{
    PyTypeObject *kind = Py_TYPE(value);
    if (kind == &PyLong_Type || kind == &PyFloat_Type || kind == &PyUnicode_Type ||
        kind == &PyBytes_Type || kind == &PyBool_Type || value == Py_None ||
        kind == &PyComplex_Type)
        return 1;
    if (depth == 0)
        return 0;
    if (kind == &PyTuple_Type || kind == &PyList_Type) {
        Py_ssize_t n = Py_SIZE(value);
        if (n > SMALL_LEN)
            return 0;
        PyObject **items = kind == &PyTuple_Type ? ((PyTupleObject *)value)->ob_item
                                                 : ((PyListObject *)value)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!is_small_plain(items[i], depth - 1))
                return 0;
        return 1;
    }
    if (kind == &PyDict_Type) {
        if (PyDict_GET_SIZE(value) > SMALL_LEN)
            return 0;
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        while (PyDict_Next(value, &pos, &key, &item))
            if (!PyUnicode_CheckExact(key) || !is_small_plain(item, depth - 1))
                return 0;
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- module functions */
PyDoc_STRVAR(sem_post_doc,
"sem_post(address) -> 0\n\nAdd a token to the sem_t at address; OSError on failure.");

static PyObject *
fp_sem_post(PyObject *module, PyObject *address)
{
    sem_t *sem = address_of(address);
    if (sem == NULL)
        return NULL;
    if (sem_post(sem) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(0);
}

PyDoc_STRVAR(sem_trywait_doc,
"sem_trywait(address) -> int\n\nTake a token without blocking: 0 if taken, else the errno.");

static PyObject *
fp_sem_trywait(PyObject *module, PyObject *address)
{
    sem_t *sem = address_of(address);
    if (sem == NULL)
        return NULL;
    return PyLong_FromLong(sem_trywait(sem) == 0 ? 0 : errno);
}

PyDoc_STRVAR(sem_wait_doc,
"sem_wait(address, deadline_ns, poll_ns, should_stop) -> int\n\n"
"Take a token, sleeping with the GIL released until deadline_ns (time.monotonic_ns;\n"
"None: forever), at most poll_ns at a time; should_stop() (or None) is asked\n"
"before every sleep. Returns 0 (taken), 1 (deadline) or 2 (stopped).");

static PyObject *
fp_sem_wait(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("sem_wait", nargs, 4, 4))
        return NULL;
    sem_t *sem = address_of(args[0]);
    if (sem == NULL)
        return NULL;
    int64_t deadline = NO_DEADLINE;
    if (args[1] != Py_None) {
        deadline = PyLong_AsLongLong(args[1]);
        if (deadline == -1 && PyErr_Occurred())
            return NULL;
        if (deadline < 0)
            deadline = 0;
    }
    int64_t poll_ns = PyLong_AsLongLong(args[2]);
    if (poll_ns == -1 && PyErr_Occurred())
        return NULL;
    if (poll_ns <= 0) {
        PyErr_SetString(PyExc_ValueError, "poll_ns must be positive");
        return NULL;
    }
    PyObject *should_stop = args[3] == Py_None ? NULL : args[3];
    int result = wait_sem(sem, deadline, poll_ns, NULL, should_stop);
    return result < 0 ? NULL : PyLong_FromLong(result);
}

/* ---------------------------------------------------------------- Endpoint */
typedef struct {
    PyObject_HEAD
    PyObject *words_view;      /* memoryview ('Q') of the control segment: keeps it mapped */
    PyObject *gens;            /* list shared with _SlotMaps: generation mapped per slot */
    PyObject *views;           /* list shared with _SlotMaps: memoryview per slot, or None */
    volatile uint64_t *words;  /* the control segment's words */
    char *sems;                /* reader 0's ready semaphore */
    Py_ssize_t num_readers;
    Py_ssize_t max_inflight;
    Py_ssize_t reader_word;    /* index of this reader's sequence number */
    int64_t poll_ns;
    int reader;                /* -1: the writer */
    int holding;               /* reader: holds a slot, release() gives it back */
    int detached;
    int status;                /* why the last call returned MISS (ST_*) */
} Endpoint;

static sem_t *
ready_sem(Endpoint *self, Py_ssize_t r)
{
    return (sem_t *)(self->sems + 2 * r * SEM_STRIDE);
}

static sem_t *
free_sem(Endpoint *self, Py_ssize_t r)
{
    return (sem_t *)(self->sems + (2 * r + 1) * SEM_STRIDE);
}

/* The bytes this process maps for ``slot`` if they are generation ``gen``, with
 * the memoryview that owns them in *owner (borrowed); NULL when Python must
 * map the slot first (never mapped, or a newer generation). */
static Py_buffer *
mapped_slot(Endpoint *self, Py_ssize_t slot, uint64_t gen, PyObject **owner)
{
    if (slot >= PyList_GET_SIZE(self->views) || slot >= PyList_GET_SIZE(self->gens))
        return NULL;
    PyObject *view = PyList_GET_ITEM(self->views, slot);
    PyObject *mapped = PyList_GET_ITEM(self->gens, slot);
    if (!PyMemoryView_Check(view) || !PyLong_CheckExact(mapped))
        return NULL;
    uint64_t mapped_gen = PyLong_AsUnsignedLongLong(mapped);
    if (mapped_gen == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    Py_buffer *buf = PyMemoryView_GET_BUFFER(view);
    if (mapped_gen != gen || buf->buf == NULL || buf->readonly || buf->itemsize != 1 ||
        !PyBuffer_IsContiguous(buf, 'C'))
        return NULL;
    *owner = view;
    return buf;
}

static PyObject *
missed(Endpoint *self, int status)
{
    self->status = status;
    return Py_NewRef(miss);
}

/* Give back free tokens 0..count-1 (a write that took them and will not fill
 * the slot). sem_post only fails on a corrupt semaphore: nothing to undo then. */
static void
give_back(Endpoint *self, Py_ssize_t count)
{
    for (Py_ssize_t r = 0; r < count; r++)
        sem_post(free_sem(self, r));
}

/* One free token per reader: the slot is released by everyone. Returns
 * ACQUIRED; or TIMED_OUT / STOPPED / -1 (exception set) with none taken. */
static int
take_free_tokens(Endpoint *self, PyObject *timeout)
{
    int64_t deadline = NO_DEADLINE;
    int have_deadline = 0, result = ACQUIRED;
    Py_ssize_t r;
    for (r = 0; r < self->num_readers; r++) {
        if (sem_trywait(free_sem(self, r)) == 0)
            continue;
        if (!have_deadline) {
            if (deadline_after(timeout, &deadline) < 0) {
                result = -1;
                break;
            }
            have_deadline = 1;
        }
        result = wait_sem(free_sem(self, r), deadline, self->poll_ns,
                          &self->words[W_CLOSED], NULL);
        if (result != ACQUIRED)
            break;
    }
    if (result != ACQUIRED)
        give_back(self, r);
    return result;
}

/* Copy the header and pickle bytes into the slot, publish it, wake the readers. */
static int
publish(Endpoint *self, Py_buffer *buf, PyObject *pickled, uint64_t seq, Py_ssize_t at)
{
    uint64_t head[2] = {(uint64_t)PyBytes_GET_SIZE(pickled), 0};
    char *dest = buf->buf;
    memcpy(dest, head, HEAD_BYTES);
    memcpy(dest + HEAD_BYTES, PyBytes_AS_STRING(pickled), (size_t)PyBytes_GET_SIZE(pickled));
    self->words[at + 2] = HEAD_BYTES + (uint64_t)PyBytes_GET_SIZE(pickled);
    self->words[at + 3] = seq;
    self->words[W_WSEQ] = seq + 1;
    for (Py_ssize_t r = 0; r < self->num_readers; r++) {
        if (sem_post(ready_sem(self, r)) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(write_doc,
"write(value, timeout=None) -> None or MISS\n\n"
"Write a small plain value (the writer's core). MISS with status FALLBACK: nothing\n"
"was done, Python writes it; WAIT_FAILED: the wait for a free slot timed out or saw\n"
"the channel closed (nothing written, tokens given back). Pickling errors raise.");

static PyObject *
Endpoint_write(Endpoint *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("write", nargs, 1, 2))
        return NULL;
    if (self->reader >= 0) {
        PyErr_SetString(PyExc_TypeError, "write() on a reader's core");
        return NULL;
    }
    PyObject *value = args[0], *timeout = nargs > 1 ? args[1] : Py_None;
    if (self->detached || self->words[W_CLOSED] || !is_small_plain(value, SMALL_DEPTH))
        return missed(self, ST_FALLBACK); /* Python raises, or pickles out of band */
    PyObject *call[2] = {value, protocol_5};
    PyObject *pickled = PyObject_Vectorcall(pickle_dumps, call, 2, NULL);
    if (pickled == NULL)
        return NULL;
    if (!PyBytes_CheckExact(pickled)) {
        Py_DECREF(pickled);
        return missed(self, ST_FALLBACK);
    }
    uint64_t nbytes = HEAD_BYTES + (uint64_t)PyBytes_GET_SIZE(pickled);
    uint64_t seq = self->words[W_WSEQ];
    Py_ssize_t slot = (Py_ssize_t)(seq % (uint64_t)self->max_inflight);
    Py_ssize_t at = W_SLOTS + SLOT_WORDS * slot;
    PyObject *owner = NULL;
    Py_buffer *buf = mapped_slot(self, slot, self->words[at], &owner);
    if (buf == NULL || nbytes > self->words[at + 1] || nbytes > (uint64_t)buf->len) {
        Py_DECREF(pickled); /* unmapped or must grow: Python does both */
        return missed(self, ST_FALLBACK);
    }
    Py_INCREF(owner); /* the mapping outlives anything done while the GIL is off */
    int result = take_free_tokens(self, timeout);
    if (result == ACQUIRED)
        result = publish(self, buf, pickled, seq, at);
    Py_DECREF(owner);
    Py_DECREF(pickled);
    if (result < 0)
        return NULL;
    if (result != ACQUIRED)
        return missed(self, ST_WAIT_FAILED);
    self->status = ST_DONE;
    Py_RETURN_NONE;
}

/* Give the held slot back to the writer. */
static int
release_held(Endpoint *self)
{
    if (!self->holding)
        return 0;
    self->holding = 0;
    if (sem_post(free_sem(self, self->reader)) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* Unpickle the value in a slot with no out-of-band buffers; MISS (DECODE)
 * when Python must map the slot or rebuild buffers. Holds the slot. */
static PyObject *
decode_slot(Endpoint *self, uint64_t seq)
{
    Py_ssize_t slot = (Py_ssize_t)(seq % (uint64_t)self->max_inflight);
    PyObject *owner = NULL;
    Py_buffer *buf = mapped_slot(self, slot, self->words[W_SLOTS + SLOT_WORDS * slot], &owner);
    uint64_t head[2] = {0, 1};
    if (buf != NULL && buf->len >= HEAD_BYTES)
        memcpy(head, buf->buf, HEAD_BYTES);
    if (buf == NULL || head[1] != 0 || head[0] > (uint64_t)buf->len - HEAD_BYTES)
        return missed(self, ST_DECODE);
    /* A window without an owner is enough: pickle.loads copies what it keeps and
     * drops its buffer before returning, and ``owner`` keeps the pages mapped
     * while unpickling runs arbitrary code (a reducer may even detach us). */
    Py_INCREF(owner);
    PyObject *window = PyMemoryView_FromMemory((char *)buf->buf + HEAD_BYTES,
                                               (Py_ssize_t)head[0], PyBUF_READ);
    PyObject *value = NULL;
    if (window != NULL) {
        value = PyObject_Vectorcall(pickle_loads, &window, 1, NULL);
        Py_DECREF(window);
    }
    Py_DECREF(owner);
    return value;
}

PyDoc_STRVAR(read_doc,
"read(timeout=None, copy=False) -> value or MISS\n\n"
"Release the held slot, wait for the next value and unpickle it (a reader's core).\n"
"MISS with status CLOSED: closed or detached (nothing held); WAIT_FAILED: timed out\n"
"or closed while waiting; DECODE: the slot is held, Python decodes it. An unpickling\n"
"error releases the slot and raises. copy=True releases the slot before returning.");

static PyObject *
Endpoint_read(Endpoint *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("read", nargs, 0, 2))
        return NULL;
    if (self->reader < 0) {
        PyErr_SetString(PyExc_TypeError, "read() on the writer's core");
        return NULL;
    }
    int copy = 0;
    if (nargs > 1 && (copy = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    if (release_held(self) < 0)
        return NULL;
    if (self->detached || self->words[W_CLOSED])
        return missed(self, ST_CLOSED);
    sem_t *ready = ready_sem(self, self->reader);
    if (sem_trywait(ready) != 0) {
        int64_t deadline;
        if (deadline_after(nargs > 0 ? args[0] : Py_None, &deadline) < 0)
            return NULL;
        int result = wait_sem(ready, deadline, self->poll_ns, &self->words[W_CLOSED], NULL);
        if (result < 0)
            return NULL;
        if (result != ACQUIRED)
            return missed(self, ST_WAIT_FAILED);
    }
    if (self->words[W_CLOSED])
        return missed(self, ST_CLOSED);
    uint64_t seq = self->words[self->reader_word];
    self->words[self->reader_word] = seq + 1;
    self->holding = 1;
    PyObject *value = decode_slot(self, seq);
    if (value == miss)
        return value;
    if ((value == NULL || copy) && release_held(self) < 0) {
        Py_XDECREF(value); /* a failed post wins over an unpickling error */
        return NULL;
    }
    self->status = ST_DONE;
    return value;
}

PyDoc_STRVAR(release_doc, "release() -> None\n\nGive the held slot back (idempotent).");

static PyObject *
Endpoint_release(Endpoint *self, PyObject *unused)
{
    if (release_held(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(forget_doc,
"forget() -> None\n\nStop holding the slot without giving it back: the reader of a value\n"
"forwarded from it gives it back (shm_channel's Forwarding).");

static PyObject *
Endpoint_forget(Endpoint *self, PyObject *unused)
{
    self->holding = 0;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(detach_doc,
"detach() -> None\n\nStop the fast path: every later write / read returns MISS.");

static PyObject *
Endpoint_detach(Endpoint *self, PyObject *unused)
{
    self->detached = 1;
    Py_RETURN_NONE;
}

/* Endpoint(words, gens, views, reader, num_readers, max_inflight, sem_offset, poll_ns) */
static int
Endpoint_check(Endpoint *self, Py_ssize_t sem_offset)
{
    Py_buffer *words = PyMemoryView_GET_BUFFER(self->words_view);
    /* header, slot table and every reader's sequence number come before the sems */
    Py_ssize_t header_words = W_SLOTS + SLOT_WORDS * self->max_inflight + self->num_readers;
    if (self->num_readers < 1 || self->max_inflight < 1 || self->reader < -1 ||
        self->reader >= self->num_readers || self->poll_ns <= 0) {
        PyErr_SetString(PyExc_ValueError, "bad reader index, reader count, slot count or poll");
        return -1;
    }
    if (words->itemsize != 8 || words->readonly || !PyBuffer_IsContiguous(words, 'C') ||
        sem_offset % SEM_STRIDE != 0 || sem_offset < 8 * header_words ||
        words->len < sem_offset + 2 * self->num_readers * SEM_STRIDE) {
        PyErr_SetString(PyExc_ValueError, "words: not a writable 'Q' view of a control segment");
        return -1;
    }
    if (self->words[W_MAGIC] != MAGIC || self->words[W_VERSION] != VERSION ||
        self->words[W_READERS] != (uint64_t)self->num_readers ||
        self->words[W_INFLIGHT] != (uint64_t)self->max_inflight) {
        PyErr_SetString(PyExc_ValueError, "control segment header does not match this build");
        return -1;
    }
    if (PyList_GET_SIZE(self->gens) != self->max_inflight ||
        PyList_GET_SIZE(self->views) != self->max_inflight) {
        PyErr_SetString(PyExc_ValueError, "gens and views need one entry per slot");
        return -1;
    }
    return 0;
}

static PyObject *
Endpoint_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *words, *gens, *views;
    int reader;
    Py_ssize_t num_readers, max_inflight, sem_offset;
    long long poll_ns;
    static char *names[] = {"words", "gens", "views", "reader", "num_readers",
                            "max_inflight", "sem_offset", "poll_ns", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!innnL:Endpoint", names,
                                     &PyMemoryView_Type, &words, &PyList_Type, &gens,
                                     &PyList_Type, &views, &reader, &num_readers,
                                     &max_inflight, &sem_offset, &poll_ns))
        return NULL;
    Endpoint *self = (Endpoint *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->words_view = Py_NewRef(words);
    self->gens = Py_NewRef(gens);
    self->views = Py_NewRef(views);
    self->words = PyMemoryView_GET_BUFFER(words)->buf;
    self->sems = (char *)PyMemoryView_GET_BUFFER(words)->buf + sem_offset;
    self->num_readers = num_readers;
    self->max_inflight = max_inflight;
    self->reader_word = W_SLOTS + SLOT_WORDS * max_inflight + (reader < 0 ? 0 : reader);
    self->poll_ns = poll_ns;
    self->reader = reader;
    if (Endpoint_check(self, sem_offset) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
Endpoint_dealloc(Endpoint *self)
{
    Py_XDECREF(self->words_view);
    Py_XDECREF(self->gens);
    Py_XDECREF(self->views);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Endpoint_methods[] = {
    {"write", (PyCFunction)(void (*)(void))Endpoint_write, METH_FASTCALL, write_doc},
    {"read", (PyCFunction)(void (*)(void))Endpoint_read, METH_FASTCALL, read_doc},
    {"release", (PyCFunction)Endpoint_release, METH_NOARGS, release_doc},
    {"forget", (PyCFunction)Endpoint_forget, METH_NOARGS, forget_doc},
    {"detach", (PyCFunction)Endpoint_detach, METH_NOARGS, detach_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Endpoint_members[] = {
    {"status", T_INT, offsetof(Endpoint, status), READONLY, "why the last call returned MISS"},
    {"holding", T_INT, offsetof(Endpoint, holding), READONLY, "a reader holds a slot"},
    {"reader", T_INT, offsetof(Endpoint, reader), READONLY, "reader index, -1: the writer"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject EndpointType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cgraph.channels._fastpath.Endpoint",
    .tp_basicsize = sizeof(Endpoint),
    .tp_dealloc = (destructor)Endpoint_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Endpoint(words, gens, views, reader, num_readers, max_inflight, sem_offset, "
              "poll_ns)\n\nThe C core of one shm channel endpoint (reader -1: the writer).",
    .tp_methods = Endpoint_methods,
    .tp_members = Endpoint_members,
    .tp_new = Endpoint_new,
};

/* ---------------------------------------------------------------- module */
static PyMethodDef module_methods[] = {
    {"sem_post", fp_sem_post, METH_O, sem_post_doc},
    {"sem_trywait", fp_sem_trywait, METH_O, sem_trywait_doc},
    {"sem_wait", (PyCFunction)(void (*)(void))fp_sem_wait, METH_FASTCALL, sem_wait_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cgraph.channels._fastpath",
    .m_doc = "C hot path of the shared-memory channel (see _fastpath.c and shm_channel.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

static int
add_constants(PyObject *module)
{
    PyObject *layout = Py_BuildValue("{s:K,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
                                     "magic", MAGIC, "version", VERSION, "closed", W_CLOSED,
                                     "writer_seq", W_WSEQ, "slots", W_SLOTS, "slot_words",
                                     SLOT_WORDS, "sem_stride", SEM_STRIDE, "head_bytes",
                                     HEAD_BYTES, "small_len", SMALL_LEN, "small_depth",
                                     SMALL_DEPTH);
    int failed = layout == NULL || PyModule_AddObjectRef(module, "LAYOUT", layout) < 0;
    Py_XDECREF(layout);
    if (failed || PyModule_AddObjectRef(module, "MISS", miss) < 0 ||
        PyModule_AddIntConstant(module, "FALLBACK", ST_FALLBACK) < 0 ||
        PyModule_AddIntConstant(module, "WAIT_FAILED", ST_WAIT_FAILED) < 0 ||
        PyModule_AddIntConstant(module, "CLOSED", ST_CLOSED) < 0 ||
        PyModule_AddIntConstant(module, "DECODE", ST_DECODE) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "Endpoint", (PyObject *)&EndpointType);
}

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    if (PyType_Ready(&EndpointType) < 0)
        return NULL;
    if (pickle_dumps == NULL) {
        PyObject *pickle = PyImport_ImportModule("pickle");
        if (pickle == NULL)
            return NULL;
        pickle_dumps = PyObject_GetAttrString(pickle, "dumps");
        pickle_loads = PyObject_GetAttrString(pickle, "loads");
        Py_DECREF(pickle);
        protocol_5 = PyLong_FromLong(5);
        miss = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
        if (pickle_dumps == NULL || pickle_loads == NULL || protocol_5 == NULL || miss == NULL)
            return NULL;
    }
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module != NULL && add_constants(module) < 0)
        Py_CLEAR(module);
    return module;
}

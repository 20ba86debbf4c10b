/* One topic's dedup ids in C (``DedupIds``, included by ``_frames.c``): what ``dedup.PyIds`` keeps in an
   OrderedDict, kept without a Python object per id, so that the direct path checks and adds an event's
   id without making its key (a tuple and two ints).

An id is (timestamp, sequence, source, peer): two unsigned 64-bit ints and two str (or None). The ids
are in an array linked oldest to newest (a duplicate moves to the newest end, its stamp unchanged; a new
id past ``bound`` pushes the oldest out) and found through an open-addressing table of indexes (linear
probing, deletion by backward shift). The hash mixes the two ints with the str hashes, which Python
keys per process, so a peer cannot pick ids that collide. Memory: the array grows by doubling up to
``bound`` entries (48 bytes each) and the table is at most four times that in 4-byte slots. */

#include <structmember.h>

typedef struct {
    uint64_t timestamp, sequence;
    PyObject *source, *peer; /* strong references, str or None */
    double stamp;            /* when it was first seen */
    uint64_t hash;
    int32_t older, newer; /* -1: none */
} IdEntry;

typedef struct {
    PyObject_HEAD
    Py_ssize_t bound;
    Py_ssize_t count, capacity;
    IdEntry *entries;
    int32_t *slots; /* mask + 1 of them, -1: empty */
    size_t mask;
    int32_t oldest, newest, unused; /* ``unused``: a free entry's index (chained by ``newer``), or -1 */
} DedupIds;

#define MAX_IDS_BOUND (1 << 28)

static PyTypeObject DedupIdsType;

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The hash of an id; -1 with an error set when a str cannot be hashed (never, for str and None). */
static int id_hash(uint64_t timestamp, uint64_t sequence, PyObject *source, PyObject *peer, uint64_t *out) {
    Py_hash_t hs = PyObject_Hash(source), hp = PyObject_Hash(peer);
    if (hs == -1 || hp == -1) return -1;
    *out = mix64(mix64(mix64(timestamp ^ (uint64_t)hs) ^ sequence) ^ (uint64_t)hp);
    return 0;
}

static int text_or_none(PyObject *value) { return value == Py_None || PyUnicode_CheckExact(value); }

/* 1 when the same text (or both None), 0 when not, -1 on an error. */
static int same_text(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (a == Py_None || b == Py_None) return 0;
    return PyUnicode_Compare(a, b) == 0 ? 1 : (PyErr_Occurred() ? -1 : 0);
}

/* The slot holding the id, or the empty slot where it would go; -1 on an error. ``*found`` says which. */
static Py_ssize_t ids_probe(DedupIds *self, uint64_t hash, uint64_t timestamp, uint64_t sequence,
                            PyObject *source, PyObject *peer, int *found) {
    size_t slot = (size_t)hash & self->mask;
    for (;;) {
        int32_t at = self->slots[slot];
        if (at < 0) {
            *found = 0;
            return (Py_ssize_t)slot;
        }
        IdEntry *e = &self->entries[at];
        if (e->hash == hash && e->timestamp == timestamp && e->sequence == sequence) {
            int same = same_text(e->source, source);
            if (same > 0) same = same_text(e->peer, peer);
            if (same < 0) return -1;
            if (same) {
                *found = 1;
                return (Py_ssize_t)slot;
            }
        }
        slot = (slot + 1) & self->mask;
    }
}

static void ids_unlink(DedupIds *self, int32_t at) {
    IdEntry *e = &self->entries[at];
    if (e->older >= 0) self->entries[e->older].newer = e->newer; else self->oldest = e->newer;
    if (e->newer >= 0) self->entries[e->newer].older = e->older; else self->newest = e->older;
}

static void ids_append(DedupIds *self, int32_t at) {
    IdEntry *e = &self->entries[at];
    e->older = self->newest;
    e->newer = -1;
    if (self->newest >= 0) self->entries[self->newest].newer = at; else self->oldest = at;
    self->newest = at;
}

/* Empties ``slot`` and shifts back what a probe would no longer find past the hole. */
static void ids_clear_slot(DedupIds *self, size_t slot) {
    size_t hole = slot, next = (slot + 1) & self->mask;
    while (self->slots[next] >= 0) {
        size_t home = (size_t)self->entries[self->slots[next]].hash & self->mask;
        /* the entry at ``next`` may move to ``hole`` unless its home lies cyclically in (hole, next] */
        if (((next - home) & self->mask) >= ((next - hole) & self->mask)) {
            self->slots[hole] = self->slots[next];
            hole = next;
        }
        next = (next + 1) & self->mask;
    }
    self->slots[hole] = -1;
}

/* Forgets the oldest id. */
static void ids_pop_oldest(DedupIds *self) {
    int32_t at = self->oldest;
    IdEntry *e = &self->entries[at];
    size_t slot = (size_t)e->hash & self->mask;
    while (self->slots[slot] != at) slot = (slot + 1) & self->mask;
    ids_clear_slot(self, slot);
    ids_unlink(self, at);
    Py_CLEAR(e->source);
    Py_CLEAR(e->peer);
    e->newer = self->unused;
    self->unused = at;
    self->count--;
}

/* Room for one more entry: the array doubled (up to ``bound``) and the table rebuilt. 0, or -1. */
static int ids_grow(DedupIds *self) {
    Py_ssize_t capacity = self->capacity ? self->capacity * 2 : 8;
    if (capacity > self->bound) capacity = self->bound;
    size_t slots = 16;
    while (slots < (size_t)capacity * 2) slots *= 2;
    IdEntry *entries = PyMem_Realloc(self->entries, sizeof(IdEntry) * (size_t)capacity);
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->entries = entries;
    int32_t *table = PyMem_Malloc(sizeof(int32_t) * slots);
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->slots);
    self->slots = table;
    self->mask = slots - 1;
    memset(table, 0xff, sizeof(int32_t) * slots);
    for (int32_t at = self->oldest; at >= 0; at = entries[at].newer) {
        size_t slot = (size_t)entries[at].hash & self->mask;
        while (table[slot] >= 0) slot = (slot + 1) & self->mask;
        table[slot] = at;
    }
    for (Py_ssize_t at = capacity - 1; at >= self->capacity; at--) {
        entries[at].newer = self->unused;
        entries[at].source = entries[at].peer = NULL;
        self->unused = (int32_t)at;
    }
    self->capacity = capacity;
    return 0;
}

/* 1: a duplicate (now the newest), 0: new (remembered at ``now``), -1: an error. ``source`` and ``peer``
   are str or None (the caller checked). */
static int ids_seen(DedupIds *self, uint64_t timestamp, uint64_t sequence, PyObject *source, PyObject *peer,
                    double now) {
    if (self->bound <= 0) return 0; /* what an OrderedDict bounded at 0 remembers: nothing */
    uint64_t hash;
    if (id_hash(timestamp, sequence, source, peer, &hash) < 0) return -1;
    int found = 0;
    if (self->slots != NULL) {
        Py_ssize_t slot = ids_probe(self, hash, timestamp, sequence, source, peer, &found);
        if (slot < 0) return -1;
        if (found) {
            int32_t at = self->slots[slot];
            if (at != self->newest) {
                ids_unlink(self, at);
                ids_append(self, at);
            }
            return 1;
        }
    }
    if (self->count >= self->bound) ids_pop_oldest(self);
    else if (self->unused < 0 && ids_grow(self) < 0) return -1;
    Py_ssize_t slot = ids_probe(self, hash, timestamp, sequence, source, peer, &found);
    if (slot < 0) return -1;
    int32_t at = self->unused;
    IdEntry *e = &self->entries[at];
    self->unused = e->newer;
    e->timestamp = timestamp;
    e->sequence = sequence;
    Py_INCREF(source);
    e->source = source;
    Py_INCREF(peer);
    e->peer = peer;
    e->stamp = now;
    e->hash = hash;
    self->slots[slot] = at;
    ids_append(self, at);
    self->count++;
    return 0;
}

/* ``key`` as (timestamp, sequence, source, peer): 0, or -1 with a TypeError / OverflowError. */
static int parse_id(PyObject *key, uint64_t *timestamp, uint64_t *sequence, PyObject **source, PyObject **peer) {
    if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 4 || !PyLong_CheckExact(PyTuple_GET_ITEM(key, 0)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(key, 1)) || !text_or_none(PyTuple_GET_ITEM(key, 2)) ||
        !text_or_none(PyTuple_GET_ITEM(key, 3))) {
        PyErr_SetString(PyExc_TypeError, "a dedup id is (timestamp: int, sequence: int, source: str, peer: str)");
        return -1;
    }
    *timestamp = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 0));
    *sequence = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 1));
    if (PyErr_Occurred()) return -1;
    *source = PyTuple_GET_ITEM(key, 2);
    *peer = PyTuple_GET_ITEM(key, 3);
    return 0;
}

static PyObject *DedupIds_seen(DedupIds *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "seen(key, now)");
        return NULL;
    }
    uint64_t timestamp, sequence;
    PyObject *source, *peer;
    if (parse_id(args[0], &timestamp, &sequence, &source, &peer) < 0) return NULL;
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    int seen = ids_seen(self, timestamp, sequence, source, peer, now);
    if (seen < 0) return NULL;
    return PyBool_FromLong(seen);
}

static PyObject *DedupIds_expire(DedupIds *self, PyObject *arg) {
    double cutoff = PyFloat_AsDouble(arg);
    if (cutoff == -1.0 && PyErr_Occurred()) return NULL;
    while (self->count > 0 && self->entries[self->oldest].stamp <= cutoff) ids_pop_oldest(self);
    Py_RETURN_NONE;
}

static PyObject *DedupIds_items(DedupIds *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (int32_t at = self->oldest; at >= 0; at = self->entries[at].newer) {
        IdEntry *e = &self->entries[at];
        PyObject *item = Py_BuildValue("((KKOO)d)", (unsigned long long)e->timestamp,
                                       (unsigned long long)e->sequence, e->source, e->peer, e->stamp);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static Py_ssize_t DedupIds_len(DedupIds *self) { return self->count; }

static PyObject *DedupIds_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Py_ssize_t bound;
    static char *names[] = {"bound", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &bound)) return NULL;
    if (bound > MAX_IDS_BOUND) {
        PyErr_Format(PyExc_ValueError, "dedup ids per topic: at most %d", MAX_IDS_BOUND);
        return NULL;
    }
    DedupIds *self = (DedupIds *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->bound = bound;
    self->oldest = self->newest = self->unused = -1;
    return (PyObject *)self;
}

static void DedupIds_dealloc(DedupIds *self) {
    for (int32_t at = self->oldest; at >= 0; at = self->entries[at].newer) {
        Py_CLEAR(self->entries[at].source);
        Py_CLEAR(self->entries[at].peer);
    }
    PyMem_Free(self->entries);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef DedupIds_methods[] = {
    {"seen", (PyCFunction)(void (*)(void))DedupIds_seen, METH_FASTCALL,
     "seen(key, now): True when key is there (it becomes the newest), else remembered at now."},
    {"expire", (PyCFunction)DedupIds_expire, METH_O,
     "expire(cutoff): forgets ids from the oldest on while they were seen at cutoff or before."},
    {"items", (PyCFunction)DedupIds_items, METH_NOARGS, "items(): [(key, stamp)], oldest first."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef DedupIds_members[] = {
    {"bound", T_PYSSIZET, offsetof(DedupIds, bound), READONLY, "at most this many ids"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods DedupIds_as_sequence = {.sq_length = (lenfunc)DedupIds_len};

static PyTypeObject DedupIdsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "meshplane.core.mesh._frames.DedupIds",
    .tp_basicsize = sizeof(DedupIds),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One topic's dedup ids, least recently seen first out (see dedup_ids.h).",
    .tp_new = DedupIds_new,
    .tp_dealloc = (destructor)DedupIds_dealloc,
    .tp_methods = DedupIds_methods,
    .tp_members = DedupIds_members,
    .tp_as_sequence = &DedupIds_as_sequence,
};

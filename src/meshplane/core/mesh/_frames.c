/* The mesh frame reader's hot loop and the frame encoder in C (``frames.py`` holds the layout and the
   reference reader and encoder).

read_frames(buffer, start, max_payload, max_subject, frame_class, kinds, text, out) -> offset

Reads frames from ``buffer[start:]`` into ``out`` while each one is whole and nothing about it is wrong:
lengths within the limits, the checksum right, a known type (``kinds[type]`` not None), its source and
subject already in ``text`` (raw bytes -> str, the reader's cache), an EVENT's payload long enough for
its timestamp. It stops at the first frame that is not, and returns that frame's offset: the Python
reader handles it (an error, a new text, the rest of a frame still to come) exactly as it would without
this loop, so both accept and refuse the same bytes. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <zlib.h>

#include "../bigendian.h"
#include "dedup_ids.h"
#include "frame_layout.h"



/* The cached text for ``size`` raw bytes (a borrowed reference), or NULL (no error set) when the cache
   does not have it. The previous frame's text is tried first: a link's frames mostly repeat it. */
typedef struct {
    const unsigned char *raw;
    Py_ssize_t size;
    PyObject *text;
} Last;

static PyObject *cached_text(PyObject *cache, Last *last, const unsigned char *raw, Py_ssize_t size) {
    if (last->text != NULL && last->size == size && memcmp(last->raw, raw, (size_t)size) == 0) {
        last->raw = raw;
        return last->text;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)raw, size);
    if (key == NULL) return NULL;
    PyObject *text = PyDict_GetItemWithError(cache, key);
    Py_DECREF(key);
    if (text != NULL) {
        last->raw = raw;
        last->size = size;
        last->text = text;
    }
    return text;
}

/* The arguments both loops begin with: (buffer, start, max_payload, max_subject). 0, or -1 with an error. */
typedef struct {
    const unsigned char *data;
    Py_ssize_t size, start, max_subject;
    unsigned long long max_payload;
} Input;

static int read_input(PyObject *const *args, Input *in) {
    in->data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    in->size = PyBytes_GET_SIZE(args[0]);
    in->start = PyLong_AsSsize_t(args[1]);
    in->max_payload = PyLong_AsUnsignedLongLong(args[2]);
    in->max_subject = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return -1;
    if (in->start < 0 || in->start > in->size) {
        PyErr_SetString(PyExc_ValueError, "start is outside the buffer");
        return -1;
    }
    return 0;
}

/* The length of the frame at ``frame`` (``available`` bytes on) when it is whole, within the limits and
   its checksum right; else 0. */
static Py_ssize_t sound_frame(const unsigned char *frame, Py_ssize_t available, unsigned long long max_payload,
                              Py_ssize_t max_subject) {
    Py_ssize_t subject_length = (Py_ssize_t)((frame[18] << 8) | frame[19]);
    if (subject_length > max_subject || available < HEAD_BYTES + subject_length + MIDDLE_BYTES) return 0;
    uint64_t payload_length = be32(frame + HEAD_BYTES + subject_length + 8);
    if (payload_length > max_payload) return 0;
    Py_ssize_t body = HEAD_BYTES + subject_length + MIDDLE_BYTES + (Py_ssize_t)payload_length;
    if (available < body + CRC_BYTES) return 0;
    if (crc32_z(0L, frame, (z_size_t)body) != be32(frame + body)) return 0;
    return body + CRC_BYTES;
}

static PyObject *read_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[5]) || !PyDict_Check(args[6]) ||
        !PyList_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_frames(bytes, start, max_payload, max_subject, frame_class, tuple, dict, list)");
        return NULL;
    }
    Input in;
    if (read_input(args, &in) < 0) return NULL;
    Py_ssize_t start = in.start;
    PyObject *frame_class = args[4], *kinds = args[5], *cache = args[6], *out = args[7];
    Py_ssize_t kind_count = PyTuple_GET_SIZE(kinds);
    Last last_source = {NULL, 0, NULL}, last_subject = {NULL, 0, NULL};

    while (in.size - start >= HEAD_BYTES) {
        const unsigned char *frame = in.data + start;
        unsigned kind = frame[0];
        Py_ssize_t whole = sound_frame(frame, in.size - start, in.max_payload, in.max_subject);
        if (whole == 0) break;
        Py_ssize_t subject_length = (Py_ssize_t)((frame[18] << 8) | frame[19]);
        const unsigned char *middle = frame + HEAD_BYTES + subject_length;
        Py_ssize_t payload_length = whole - HEAD_BYTES - subject_length - MIDDLE_BYTES - CRC_BYTES;
        if ((Py_ssize_t)kind >= kind_count || PyTuple_GET_ITEM(kinds, kind) == Py_None) break;
        if (kind == EVENT_TYPE && payload_length < STAMP_BYTES) break;
        PyObject *source = cached_text(cache, &last_source, frame + 2, SOURCE_BYTES);
        if (source == NULL) {
            if (PyErr_Occurred()) return NULL;
            break;
        }
        PyObject *subject = cached_text(cache, &last_subject, frame + HEAD_BYTES, subject_length);
        if (subject == NULL) {
            if (PyErr_Occurred()) return NULL;
            break;
        }
        PyObject *fields[7] = {
            PyTuple_GET_ITEM(kinds, kind),
            PyLong_FromLong(frame[1]),
            source,
            subject,
            PyLong_FromUnsignedLongLong(be64(middle)),
            PyBytes_FromStringAndSize((const char *)middle + MIDDLE_BYTES, payload_length),
            PyBytes_FromStringAndSize((const char *)frame, whole),
        };
        PyObject *made = NULL;
        if (fields[1] != NULL && fields[4] != NULL && fields[5] != NULL && fields[6] != NULL)
            made = PyObject_Vectorcall(frame_class, fields, 7, NULL);
        Py_XDECREF(fields[1]);
        Py_XDECREF(fields[4]);
        Py_XDECREF(fields[5]);
        Py_XDECREF(fields[6]);
        if (made == NULL) return NULL;
        int failed = PyList_Append(out, made);
        Py_DECREF(made);
        if (failed) return NULL;
        start += whole;
    }
    return PyLong_FromSsize_t(start);
}


/* route_events(buffer, start, max_payload, max_subject, origin, text, table, limit, peer, now, runs) -> offset

The node's direct path for a batch: plain EVENTs (flags 0) read from ``buffer[start:]`` and copied, as
they came, to the write buffers their subject's route names, with no object per event. It takes the
frames ``read_frames`` would take and, of those, only what the table knows, and stops (returning the
frame's offset, for the Python path to handle as it would anyway) at the first that is anything else:
another type or flags, a subject not in ``table``, a source that is not ``origin`` (16 raw bytes; None:
any source the ``text`` cache knows), or before a frame that would take a write buffer past ``limit``.

``table``: raw subject -> (info, ids, buffers): ``buffers`` a tuple of bytearrays each such event is
appended to, or of (bytearray, b"MSG subject sid ") for a NATS client, which gets the event's body as
a MSG (``MSG subject sid size CR LF body CR LF``); ``ids`` None, or the topic's dedup ids (a
``DedupIds`` of (timestamp, sequence, source, peer), the ids ``DedupCache.seen`` keeps): an id already there is a duplicate (made the newest, not
delivered), a new one is added at ``now`` and the oldest dropped past the ids' bound.
``runs`` gets (info, events, duplicates) for each run of consecutive events of one entry. */

/* A route's target: a bytearray (the frame as it came), or (bytearray, prefix: bytes) (a NATS client's MSG,
   ``prefix`` its ``MSG subject sid `` part). */
static int target_of(PyObject *item, PyObject **buffer, PyObject **prefix) {
    if (PyByteArray_Check(item)) {
        *buffer = item;
        *prefix = NULL;
        return 0;
    }
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && PyByteArray_Check(PyTuple_GET_ITEM(item, 0)) &&
        PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
        *buffer = PyTuple_GET_ITEM(item, 0);
        *prefix = PyTuple_GET_ITEM(item, 1);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "a route's buffers are bytearrays or (bytearray, MSG prefix)");
    return -1;
}

static PyObject *route_events(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyBytes_Check(args[0]) || !(args[4] == Py_None || PyBytes_Check(args[4])) ||
        !PyDict_Check(args[5]) || !PyDict_Check(args[6]) || !text_or_none(args[8]) || !PyList_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError,
                        "route_events(bytes, start, max_payload, max_subject, origin, dict, dict, limit, peer: str, "
                        "now, list)");
        return NULL;
    }
    Input in;
    if (read_input(args, &in) < 0) return NULL;
    const unsigned char *data = in.data;
    Py_ssize_t size = in.size, start = in.start;
    Py_ssize_t limit = PyLong_AsSsize_t(args[7]);
    double now = PyFloat_AsDouble(args[9]);
    if (PyErr_Occurred()) return NULL;
    const unsigned char *origin = NULL;
    if (args[4] != Py_None) {
        if (PyBytes_GET_SIZE(args[4]) != SOURCE_BYTES) {
            PyErr_SetString(PyExc_ValueError, "origin: 16 raw bytes");
            return NULL;
        }
        origin = (const unsigned char *)PyBytes_AS_STRING(args[4]);
    }
    PyObject *text = args[5], *table = args[6], *peer = args[8], *runs = args[10];
    Last last_source = {NULL, 0, NULL};
    const unsigned char *last_subject = NULL;
    Py_ssize_t last_subject_length = 0;
    PyObject *entry = NULL, *info = NULL;  /* borrowed from the table, which the caller holds */
    Py_ssize_t events = 0, duplicates = 0;

    while (size - start >= HEAD_BYTES) {
        const unsigned char *frame = data + start;
        if (frame[0] != EVENT_TYPE || frame[1] != 0) break;
        Py_ssize_t whole = sound_frame(frame, size - start, in.max_payload, in.max_subject);
        Py_ssize_t subject_length = (Py_ssize_t)((frame[18] << 8) | frame[19]);
        if (whole == 0 || whole - HEAD_BYTES - subject_length - MIDDLE_BYTES - CRC_BYTES < STAMP_BYTES) break;
        const unsigned char *middle = frame + HEAD_BYTES + subject_length;
        PyObject *source = NULL;
        if (origin != NULL) {
            if (memcmp(frame + 2, origin, SOURCE_BYTES) != 0) break;
        } else {
            source = cached_text(text, &last_source, frame + 2, SOURCE_BYTES);
            if (source == NULL) {
                if (PyErr_Occurred()) goto error;
                break;
            }
        }
        /* The route: the previous frame's when the subject repeats (no key made), else the table's. */
        if (entry == NULL || subject_length != last_subject_length ||
            memcmp(frame + HEAD_BYTES, last_subject, (size_t)subject_length) != 0) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)frame + HEAD_BYTES, subject_length);
            if (key == NULL) goto error;
            PyObject *found = PyDict_GetItemWithError(table, key);
            Py_DECREF(key);
            if (found == NULL) {
                if (PyErr_Occurred()) goto error;
                break;
            }
            if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(found, 2))) {
                PyErr_SetString(PyExc_TypeError, "a route entry is (info, ids, buffers)");
                goto error;
            }
            if (found != entry) {
                if (flush_run(runs, info, events, duplicates) < 0) goto error;
                entry = found;
                info = PyTuple_GET_ITEM(found, 0);
                events = duplicates = 0;
            }
        }
        last_subject = frame + HEAD_BYTES;
        last_subject_length = subject_length;
        PyObject *buffers = PyTuple_GET_ITEM(entry, 2), *ids = PyTuple_GET_ITEM(entry, 1);
        Py_ssize_t count = PyTuple_GET_SIZE(buffers);
        int full = 0;
        /* A NATS client's (bytearray, "MSG subject sid ") takes the event as a MSG: its body and its size. */
        const unsigned char *body = middle + MIDDLE_BYTES + STAMP_BYTES;
        Py_ssize_t body_size = whole - HEAD_BYTES - subject_length - MIDDLE_BYTES - STAMP_BYTES - CRC_BYTES;
        char digits[24];
        int digits_size = snprintf(digits, sizeof digits, "%zd\r\n", body_size);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *buffer, *prefix;
            if (target_of(PyTuple_GET_ITEM(buffers, i), &buffer, &prefix) < 0) goto error;
            Py_ssize_t adds = prefix == NULL ? whole : PyBytes_GET_SIZE(prefix) + digits_size + body_size + 2;
            if (PyByteArray_GET_SIZE(buffer) + adds > limit && PyByteArray_GET_SIZE(buffer) > 0) full = 1;
        }
        if (full) break;
        if (ids != Py_None) {
            if (Py_TYPE(ids) != &DedupIdsType) {
                PyErr_SetString(PyExc_TypeError, "a route's dedup ids are a DedupIds");
                goto error;
            }
            int seen = ids_seen((DedupIds *)ids, be64(middle + MIDDLE_BYTES), be64(middle),
                                source != NULL ? source : Py_None, peer, now);
            if (seen < 0) goto error;
            if (seen) {
                duplicates++;
                events++;
                start += whole;
                continue;
            }
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *buffer, *prefix;
            target_of(PyTuple_GET_ITEM(buffers, i), &buffer, &prefix);  /* checked above */
            Py_ssize_t used = PyByteArray_GET_SIZE(buffer);
            if (prefix == NULL) {
                if (PyByteArray_Resize(buffer, used + whole) < 0) goto error;
                memcpy(PyByteArray_AS_STRING(buffer) + used, frame, (size_t)whole);
                continue;
            }
            Py_ssize_t prefix_size = PyBytes_GET_SIZE(prefix);
            if (PyByteArray_Resize(buffer, used + prefix_size + digits_size + body_size + 2) < 0) goto error;
            char *p = PyByteArray_AS_STRING(buffer) + used;
            memcpy(p, PyBytes_AS_STRING(prefix), (size_t)prefix_size);
            memcpy(p + prefix_size, digits, (size_t)digits_size);
            memcpy(p + prefix_size + digits_size, body, (size_t)body_size);
            memcpy(p + prefix_size + digits_size + body_size, "\r\n", 2);
        }
        events++;
        start += whole;
    }
    if (flush_run(runs, info, events, duplicates) < 0) return NULL;
    return PyLong_FromSsize_t(start);
error: {
        /* What was copied stays accounted: the caller sends it and counts the runs before raising. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (flush_run(runs, info, events, duplicates) < 0) PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
}


/* A value in [0, limit], or -1 (no error set) when it is not an int in range. */
static int in_range(PyObject *value, unsigned long long limit, unsigned long long *out) {
    if (!PyLong_Check(value)) return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(value);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        if (u > limit) return -1;
        *out = u;
        return 0;
    }
    if (overflow < 0 || v < 0 || (unsigned long long)v > limit) return -1;
    *out = (unsigned long long)v;
    return 0;
}

/* encode_frame(kind, flags, source, subject, sequence, payload, timestamp) -> bytes | None

   The frame ``frames.encode_frame`` makes (``encode_event`` when ``timestamp`` is not None: the payload
   is the timestamp, then ``payload``), or None for anything but the plain case (a value out of range,
   text that is not UTF-8, a payload that is not bytes): the Python encoder then says what is wrong. */
static PyObject *encode_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "encode_frame takes 7 arguments");
        return NULL;
    }
    unsigned long long kind, flags, sequence, timestamp = 0;
    int stamped = args[6] != Py_None;
    if (in_range(args[0], 255, &kind) || in_range(args[1], 255, &flags) ||
        in_range(args[4], UINT64_MAX, &sequence) || (stamped && in_range(args[6], UINT64_MAX, &timestamp)) ||
        !PyUnicode_Check(args[2]) || !PyUnicode_Check(args[3]) || !PyBytes_Check(args[5]))
        Py_RETURN_NONE;
    Py_ssize_t source_size, subject_size;
    const char *source = PyUnicode_AsUTF8AndSize(args[2], &source_size);
    const char *subject = source != NULL ? PyUnicode_AsUTF8AndSize(args[3], &subject_size) : NULL;
    if (subject == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t payload_size = PyBytes_GET_SIZE(args[5]) + (stamped ? STAMP_BYTES : 0);
    if (subject_size > 0xffff || (unsigned long long)payload_size > 0xffffffffULL) Py_RETURN_NONE;
    Py_ssize_t body = HEAD_BYTES + subject_size + MIDDLE_BYTES + payload_size;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, body + CRC_BYTES);
    if (frame == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frame);
    p[0] = (unsigned char)kind;
    p[1] = (unsigned char)flags;
    memset(p + 2, 0, SOURCE_BYTES);  /* struct's "16s": cut or padded with NULs */
    memcpy(p + 2, source, (size_t)(source_size < SOURCE_BYTES ? source_size : SOURCE_BYTES));
    put_be(p + 18, (uint64_t)subject_size, 2);
    memcpy(p + HEAD_BYTES, subject, (size_t)subject_size);
    unsigned char *middle = p + HEAD_BYTES + subject_size;
    put_be(middle, sequence, 8);
    put_be(middle + 8, (uint64_t)payload_size, 4);
    unsigned char *payload = middle + MIDDLE_BYTES;
    if (stamped) {
        put_be(payload, timestamp, STAMP_BYTES);
        payload += STAMP_BYTES;
    }
    memcpy(payload, PyBytes_AS_STRING(args[5]), (size_t)PyBytes_GET_SIZE(args[5]));
    put_be(p + body, crc32_z(0L, p, (z_size_t)body), CRC_BYTES);
    return frame;
}

static PyMethodDef methods[] = {
    {"encode_frame", (PyCFunction)(void (*)(void))encode_frame, METH_FASTCALL,
     "The frame frames.encode_frame (or encode_event) makes, or None where only Python says why not."},
    {"route_events", (PyCFunction)(void (*)(void))route_events, METH_FASTCALL,
     "Plain EVENTs copied to the write buffers of their cached routes (see the function)."},
    {"read_frames", (PyCFunction)(void (*)(void))read_frames, METH_FASTCALL,
     "Whole, sound frames from a buffer; the offset of the first that is not (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) {
    if (PyType_Ready(&DedupIdsType) < 0) return NULL;
    PyObject *made = PyModule_Create(&module);
    if (made == NULL) return NULL;
    Py_INCREF(&DedupIdsType);
    if (PyModule_AddObject(made, "DedupIds", (PyObject *)&DedupIdsType) < 0) {
        Py_DECREF(&DedupIdsType);
        Py_DECREF(made);
        return NULL;
    }
    return made;
}

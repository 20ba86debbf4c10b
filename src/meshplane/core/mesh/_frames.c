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

#define HEAD_BYTES 20   /* type, flags, source (16), subject length (2) */
#define SOURCE_BYTES 16
#define MIDDLE_BYTES 12 /* sequence (8), payload length (4) */
#define CRC_BYTES 4
#define STAMP_BYTES 8   /* an EVENT's payload starts with its timestamp */
#define EVENT_TYPE 3



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

static PyObject *read_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[5]) || !PyDict_Check(args[6]) ||
        !PyList_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_frames(bytes, start, max_payload, max_subject, frame_class, tuple, dict, list)");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    unsigned long long max_payload = PyLong_AsUnsignedLongLong(args[2]);
    Py_ssize_t max_subject = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (start < 0 || start > size) {
        PyErr_SetString(PyExc_ValueError, "start is outside the buffer");
        return NULL;
    }
    PyObject *frame_class = args[4], *kinds = args[5], *cache = args[6], *out = args[7];
    Py_ssize_t kind_count = PyTuple_GET_SIZE(kinds);
    Last last_source = {NULL, 0, NULL}, last_subject = {NULL, 0, NULL};

    while (size - start >= HEAD_BYTES) {
        const unsigned char *frame = data + start;
        unsigned kind = frame[0];
        Py_ssize_t subject_length = (Py_ssize_t)((frame[18] << 8) | frame[19]);
        if (subject_length > max_subject || size - start < HEAD_BYTES + subject_length + MIDDLE_BYTES) break;
        const unsigned char *middle = frame + HEAD_BYTES + subject_length;
        uint64_t payload_length = be32(middle + 8);
        if (payload_length > max_payload) break;
        Py_ssize_t body = HEAD_BYTES + subject_length + MIDDLE_BYTES + (Py_ssize_t)payload_length;
        if (size - start < body + CRC_BYTES) break;
        if (crc32_z(0L, frame, (z_size_t)body) != be32(frame + body)) break;
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
            PyBytes_FromStringAndSize((const char *)middle + MIDDLE_BYTES, (Py_ssize_t)payload_length),
            PyBytes_FromStringAndSize((const char *)frame, body + CRC_BYTES),
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
        start += body + CRC_BYTES;
    }
    return PyLong_FromSsize_t(start);
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
    {"read_frames", (PyCFunction)(void (*)(void))read_frames, METH_FASTCALL,
     "Whole, sound frames from a buffer; the offset of the first that is not (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }

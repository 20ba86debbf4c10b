/* The NATS door's hot loop in C: whole PUB and HPUB operations read from a client's buffer
   (``nats_protocol.py`` holds the grammar and the reference parser).

Both functions take only operations where nothing is unusual: ``PUB``/``HPUB`` in capitals at the
start of a control line of at most ``max_control`` bytes ending in one CR LF, arguments of printable
ASCII separated by spaces, sizes of 1 to 12 digits within ``max_payload``, the payload whole and
followed by CR LF, a header block ``NATS/1.0 ... CR LF CR LF`` of at least 12 bytes. They stop at the
first operation that is anything else (or not whole yet) and return its offset: the Python parser
reads it from there exactly as it would without them, so both accept and refuse the same bytes
(``tests/unit/test_nats_native.py`` holds them to it with hypothesis).

parse_pubs(buffer, start, max_payload, max_control, out) -> offset
    appends (subject, reply, payload, headers or None) per operation to ``out``.

route_pubs(buffer, start, max_payload, max_control, table, source, sequence, timestamp, limit, runs,
           headers) -> offset
    the node's direct path for a NATS client's PUBs without a reply subject (HPUBs too where
    ``headers`` is true: the client said so in its CONNECT) on subjects ``table`` knows (raw subject
    -> (info, mesh subject, buffers)): each becomes the EVENT frame the node would make (``source`` 16
    raw bytes, sequences from ``sequence`` on, ``timestamp`` in ms; a PUB's payload as it is with flags
    0, an HPUB's in the envelope ``nats_protocol.wrap`` makes with FLAG_NATS_ENVELOPE) and is appended
    to each of the entry's bytearrays, with no object per event. A reply subject is Python's: it is
    checked, may be a service import's request and may be answered 503 (no responders). It stops
    before a frame that would take a buffer past ``limit``; ``runs`` gets (info, events, 0) per run of
    one entry (the shape ``route_events`` of ``_frames.c`` gives the direct path). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "../bigendian.h"
#include "../mesh/frame_layout.h"
#define MAX_ARGS 4
#define HEADER_LINE "NATS/1.0"
#define MIN_HEADERS 12 /* HEADER_LINE and two CR LF */
#define FLAG_NATS_ENVELOPE 0x40 /* frames.py's */
#define ENVELOPE_MAGIC "NATS\x01"
#define ENVELOPE_BYTES 11 /* the magic (5), the reply's length (2), the headers' (4) */

typedef struct {
    const unsigned char *arg[MAX_ARGS];
    Py_ssize_t length[MAX_ARGS];
    int args;
    int headers; /* HPUB */
    Py_ssize_t header_size, total;
    const unsigned char *data;
} PubOp;

/* A size as the reference takes it: 1 to 12 ASCII digits; -1 otherwise. */
static long long size_of(const unsigned char *p, Py_ssize_t n) {
    if (n < 1 || n > 12) return -1;
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* The whole length of the plain PUB/HPUB at ``p`` (``available`` bytes there), or 0 to stop. */
static Py_ssize_t scan_pub(const unsigned char *p, Py_ssize_t available, Py_ssize_t max_payload,
                           Py_ssize_t max_control, PubOp *op) {
    Py_ssize_t at;
    if (available >= 4 && memcmp(p, "PUB ", 4) == 0) {
        op->headers = 0;
        at = 4;
    } else if (available >= 5 && memcmp(p, "HPUB ", 5) == 0) {
        op->headers = 1;
        at = 5;
    } else {
        return 0;
    }
    Py_ssize_t scan = available < max_control + 1 ? available : max_control + 1;
    const unsigned char *newline = memchr(p, '\n', (size_t)scan);
    if (newline == NULL) return 0;
    Py_ssize_t line = newline - p; /* the CR LF at line - 1 */
    if (line < 2 || p[line - 1] != '\r' || p[line - 2] == '\r') return 0;
    op->args = 0;
    while (at < line - 1) {
        if (p[at] == ' ') {
            at++;
            continue;
        }
        Py_ssize_t begin = at;
        while (at < line - 1 && p[at] > 0x20 && p[at] < 0x7f) at++;
        if (at < line - 1 && p[at] != ' ') return 0; /* a tab, a control byte, non-ASCII: the reference's */
        if (op->args == MAX_ARGS) return 0;
        op->arg[op->args] = p + begin;
        op->length[op->args++] = at - begin;
    }
    int least = op->headers ? 3 : 2;
    if (op->args < least || op->args > least + 1) return 0;
    long long total = size_of(op->arg[op->args - 1], op->length[op->args - 1]);
    long long header_size = op->headers ? size_of(op->arg[op->args - 2], op->length[op->args - 2]) : 0;
    if (total < 0 || header_size < 0 || total > max_payload) return 0;
    if (op->headers && (header_size < MIN_HEADERS || header_size > total)) return 0;
    Py_ssize_t start = line + 1;
    if (available - start < total + 2) return 0;
    const unsigned char *data = p + start;
    if (data[total] != '\r' || data[total + 1] != '\n') return 0;
    if (op->headers && (memcmp(data, HEADER_LINE, 8) != 0 || memcmp(data + header_size - 4, "\r\n\r\n", 4) != 0))
        return 0;
    op->data = data;
    op->total = (Py_ssize_t)total;
    op->header_size = op->headers ? (Py_ssize_t)header_size : -1;
    return start + (Py_ssize_t)total + 2;
}

typedef struct {
    const unsigned char *data;
    Py_ssize_t size, start, max_payload, max_control;
    Py_buffer view;
} Input;

static int read_input(PyObject *const *args, Input *in) {
    if (PyObject_GetBuffer(args[0], &in->view, PyBUF_SIMPLE) < 0) return -1;
    in->data = in->view.buf;
    in->size = in->view.len;
    in->start = PyLong_AsSsize_t(args[1]);
    in->max_payload = PyLong_AsSsize_t(args[2]);
    in->max_control = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&in->view);
        return -1;
    }
    if (in->start < 0 || in->start > in->size) {
        PyBuffer_Release(&in->view);
        PyErr_SetString(PyExc_ValueError, "start: an offset in the buffer");
        return -1;
    }
    return 0;
}

static PyObject *parse_pubs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "parse_pubs(buffer, start, max_payload, max_control, list)");
        return NULL;
    }
    Input in;
    if (read_input(args, &in) < 0) return NULL;
    Py_ssize_t start = in.start;
    PubOp op;
    for (;;) {
        Py_ssize_t whole = scan_pub(in.data + start, in.size - start, in.max_payload, in.max_control, &op);
        if (whole == 0) break;
        int reply = op.args == (op.headers ? 4 : 3);
        Py_ssize_t header_size = op.headers ? op.header_size : 0;
        PyObject *item = Py_BuildValue(
            "(s#s#y#)", (const char *)op.arg[0], op.length[0], reply ? (const char *)op.arg[1] : "",
            reply ? op.length[1] : (Py_ssize_t)0, (const char *)op.data + header_size, op.total - header_size);
        if (item == NULL) goto error;
        PyObject *headers = op.headers ? PyBytes_FromStringAndSize((const char *)op.data, header_size) : Py_NewRef(Py_None);
        if (headers == NULL) {
            Py_DECREF(item);
            goto error;
        }
        PyObject *whole_item = PyTuple_Pack(4, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1),
                                            PyTuple_GET_ITEM(item, 2), headers);
        Py_DECREF(item);
        Py_DECREF(headers);
        if (whole_item == NULL) goto error;
        int failed = PyList_Append(args[4], whole_item);
        Py_DECREF(whole_item);
        if (failed) goto error;
        start += whole;
    }
    PyBuffer_Release(&in.view);
    return PyLong_FromSsize_t(start);
error:
    PyBuffer_Release(&in.view);
    return NULL;
}

static PyObject *route_pubs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyDict_Check(args[4]) || !PyBytes_Check(args[5]) ||
        PyBytes_GET_SIZE(args[5]) != SOURCE_BYTES || !PyList_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError,
                        "route_pubs(buffer, start, max_payload, max_control, dict, source: 16 bytes, sequence, "
                        "timestamp, limit, list, headers)");
        return NULL;
    }
    uint64_t sequence = (uint64_t)PyLong_AsUnsignedLongLong(args[6]);
    uint64_t timestamp = (uint64_t)PyLong_AsUnsignedLongLong(args[7]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred()) return NULL;
    int headers = PyObject_IsTrue(args[10]);
    if (headers < 0) return NULL;
    Input in;
    if (read_input(args, &in) < 0) return NULL;
    PyObject *table = args[4], *runs = args[9];
    const unsigned char *source = (const unsigned char *)PyBytes_AS_STRING(args[5]);
    Py_ssize_t start = in.start, events = 0;
    PyObject *entry = NULL, *info = NULL; /* borrowed from the table, which the caller holds */
    const unsigned char *last_subject = NULL;
    Py_ssize_t last_length = 0;
    PubOp op;
    for (;;) {
        Py_ssize_t whole = scan_pub(in.data + start, in.size - start, in.max_payload, in.max_control, &op);
        if (whole == 0 || op.args != (op.headers ? 3 : 2) || (op.headers && !headers)) break; /* Python's */
        if (entry == NULL || op.length[0] != last_length || memcmp(op.arg[0], last_subject, (size_t)last_length) != 0) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)op.arg[0], op.length[0]);
            if (key == NULL) goto error;
            PyObject *found = PyDict_GetItemWithError(table, key);
            Py_DECREF(key);
            if (found == NULL) {
                if (PyErr_Occurred()) goto error;
                break;
            }
            if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(found, 1)) ||
                PyBytes_GET_SIZE(PyTuple_GET_ITEM(found, 1)) > 0xffff || !PyTuple_Check(PyTuple_GET_ITEM(found, 2))) {
                PyErr_SetString(PyExc_TypeError, "a route entry is (info, subject: bytes, buffers)");
                goto error;
            }
            if (found != entry) {
                if (flush_run(runs, info, events, 0) < 0) goto error;
                entry = found;
                info = PyTuple_GET_ITEM(found, 0);
                events = 0;
            }
            last_subject = op.arg[0];
            last_length = op.length[0];
        }
        PyObject *subject = PyTuple_GET_ITEM(entry, 1), *buffers = PyTuple_GET_ITEM(entry, 2);
        Py_ssize_t subject_length = PyBytes_GET_SIZE(subject);
        Py_ssize_t envelope = op.headers ? ENVELOPE_BYTES : 0;
        Py_ssize_t body = HEAD_BYTES + subject_length + MIDDLE_BYTES + STAMP_BYTES + envelope + op.total;
        Py_ssize_t frame = body + CRC_BYTES, count = PyTuple_GET_SIZE(buffers);
        int full = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *buffer = PyTuple_GET_ITEM(buffers, i);
            if (!PyByteArray_Check(buffer)) {
                PyErr_SetString(PyExc_TypeError, "a route's buffers are bytearrays");
                goto error;
            }
            if (PyByteArray_GET_SIZE(buffer) + frame > limit && PyByteArray_GET_SIZE(buffer) > 0) full = 1;
        }
        if (full) break;
        unsigned char *first = NULL;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *buffer = PyTuple_GET_ITEM(buffers, i);
            Py_ssize_t used = PyByteArray_GET_SIZE(buffer);
            if (PyByteArray_Resize(buffer, used + frame) < 0) goto error;
            unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(buffer) + used;
            if (first != NULL) {
                memcpy(p, first, (size_t)frame);
                continue;
            }
            p[0] = EVENT_TYPE;
            p[1] = op.headers ? FLAG_NATS_ENVELOPE : 0;
            memcpy(p + 2, source, SOURCE_BYTES);
            put_be(p + 18, (uint64_t)subject_length, 2);
            memcpy(p + HEAD_BYTES, PyBytes_AS_STRING(subject), (size_t)subject_length);
            unsigned char *middle = p + HEAD_BYTES + subject_length;
            put_be(middle, sequence, 8);
            put_be(middle + 8, (uint64_t)(STAMP_BYTES + envelope + op.total), 4);
            put_be(middle + MIDDLE_BYTES, timestamp, STAMP_BYTES);
            unsigned char *payload = middle + MIDDLE_BYTES + STAMP_BYTES;
            if (op.headers) { /* no reply: its length 0, then the header block's */
                memcpy(payload, ENVELOPE_MAGIC, 5);
                put_be(payload + 5, 0, 2);
                put_be(payload + 7, (uint64_t)op.header_size, 4);
            }
            memcpy(payload + envelope, op.data, (size_t)op.total);
            put_be(p + body, crc32_z(0L, p, (z_size_t)body), CRC_BYTES);
            first = p;
        }
        sequence++;
        events++;
        start += whole;
    }
    PyBuffer_Release(&in.view);
    if (flush_run(runs, info, events, 0) < 0) return NULL;
    return PyLong_FromSsize_t(start);
error: {
        /* What was copied stays accounted: the caller sends it and counts the runs before raising. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyBuffer_Release(&in.view);
        if (flush_run(runs, info, events, 0) < 0) PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
}

static PyMethodDef methods[] = {
    {"parse_pubs", (PyCFunction)(void (*)(void))parse_pubs, METH_FASTCALL,
     "Whole, plain PUB/HPUB operations from a buffer; the offset of the first that is not (see the module)."},
    {"route_pubs", (PyCFunction)(void (*)(void))route_pubs, METH_FASTCALL,
     "A NATS client's PUBs and HPUBs without a reply as EVENT frames in the write buffers of their routes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nats", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nats(void) { return PyModule_Create(&module); }

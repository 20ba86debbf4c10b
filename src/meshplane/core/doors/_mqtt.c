/* The MQTT door's hot loop in C: a connected client's run of plain PUBLISH and PUBACK packets read
   from its buffer (``mqtt_codec.py`` holds the rules and the reference reader).

read_run(buffer, level, max_packet, out) -> offset
    appends per packet, to ``out``: a PUBLISH as (topic, payload, qos, retain, dup, packet_id), a
    PUBACK as its packet identifier (an int). It takes only packets where nothing is unusual: whole,
    at most ``max_packet`` bytes, a PUBLISH of QoS 0 or 1 (no DUP at QoS 0) with a UTF-8 topic holding
    no U+0000, a packet identifier other than 0 at QoS 1 and (MQTT 5, ``level`` 5) an empty property
    block; a PUBACK of two bytes, flags 0, identifier other than 0. It stops at the first packet that
    is anything else (or not whole yet) and returns its offset: the Python reader reads from there
    exactly as it would without it, so both accept and refuse the same bytes
    (``tests/unit/test_mqtt_native.py`` holds them to it with hypothesis).

encode_publish(topic, payload, qos, retain, dup, packet_id, level) -> bytes
    ``mqtt_packets.encode_publish``'s bytes (a PUBLISH without properties), made in one allocation. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define PUBLISH 3
#define PUBACK 4
#define V5 5

/* The offset of the first packet this does not take (see the module). */
static Py_ssize_t read_run(const unsigned char *p, Py_ssize_t size, long level, Py_ssize_t max_packet,
                           PyObject *out) {
    Py_ssize_t at = 0;
    while (at < size) {
        Py_ssize_t length = 0, header = 1;
        int shift = 0, whole = 0;
        while (header <= 4 && at + header < size) {
            unsigned char byte = p[at + header];
            length |= (Py_ssize_t)(byte & 0x7F) << shift;
            header++;
            if (!(byte & 0x80)) {
                whole = 1;
                break;
            }
            shift += 7;
        }
        if (!whole || header + length > max_packet || at + header + length > size) return at;
        const unsigned char *body = p + at + header;
        int kind = p[at] >> 4, flags = p[at] & 0x0F;
        PyObject *item;
        if (kind == PUBACK) {
            if (flags || length != 2) return at;
            long packet_id = (body[0] << 8) | body[1];
            if (!packet_id) return at;
            item = PyLong_FromLong(packet_id);
        } else if (kind == PUBLISH) {
            int qos = (flags >> 1) & 3, dup = (flags & 8) != 0, retain = flags & 1;
            if (qos > 1 || (dup && !qos) || length < 2) return at;
            Py_ssize_t topic_size = (body[0] << 8) | body[1], used = 2 + topic_size;
            long packet_id = 0;
            if (used > length || memchr(body + 2, 0, (size_t)topic_size) != NULL) return at;
            if (qos) {
                if (used + 2 > length) return at;
                packet_id = (body[used] << 8) | body[used + 1];
                if (!packet_id) return at;
                used += 2;
            }
            if (level == V5) {
                if (used >= length || body[used] != 0) return at; /* properties: the Python reader */
                used += 1;
            }
            PyObject *topic = PyUnicode_DecodeUTF8((const char *)body + 2, topic_size, "strict");
            if (topic == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
                PyErr_Clear();
                return at;
            }
            item = Py_BuildValue("(Ny#iOOl)", topic, (const char *)body + used, length - used, qos,
                                 retain ? Py_True : Py_False, dup ? Py_True : Py_False, packet_id);
        } else {
            return at;
        }
        if (item == NULL) return -1;
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed) return -1;
        at += header + length;
    }
    return at;
}

static PyObject *read_run_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "read_run(buffer, level, max_packet, out: list)");
        return NULL;
    }
    long level = PyLong_AsLong(args[1]);
    Py_ssize_t max_packet = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t offset = read_run(view.buf, view.len, level, max_packet, args[3]);
    PyBuffer_Release(&view);
    return offset < 0 ? NULL : PyLong_FromSsize_t(offset);
}

#define MAX_REMAINING 268435455

static PyObject *encode_publish(PyObject *self, PyObject *args) {
    const char *topic;
    Py_ssize_t topic_size;
    Py_buffer payload;
    int qos, retain, dup, level;
    long packet_id;
    (void)self;
    if (!PyArg_ParseTuple(args, "s#y*ippli", &topic, &topic_size, &payload, &qos, &retain, &dup,
                          &packet_id, &level))
        return NULL;
    Py_ssize_t size = 2 + topic_size + (qos ? 2 : 0) + (level == V5) + payload.len;
    if (size > MAX_REMAINING || topic_size > 0xFFFF) {
        PyBuffer_Release(&payload);
        PyErr_Format(PyExc_ValueError, "%zd does not fit MQTT's variable-length integer", size);
        return NULL;
    }
    unsigned char header[5];
    Py_ssize_t header_size = 1, rest = size;
    header[0] = (unsigned char)(PUBLISH << 4 | dup << 3 | qos << 1 | retain);
    do {
        unsigned char byte = rest & 0x7F;
        rest >>= 7;
        header[header_size++] = rest ? byte | 0x80 : byte;
    } while (rest);
    PyObject *out = PyBytes_FromStringAndSize(NULL, header_size + size);
    if (out != NULL) {
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
        memcpy(p, header, (size_t)header_size);
        p += header_size;
        *p++ = (unsigned char)(topic_size >> 8);
        *p++ = (unsigned char)topic_size;
        memcpy(p, topic, (size_t)topic_size);
        p += topic_size;
        if (qos) {
            *p++ = (unsigned char)(packet_id >> 8);
            *p++ = (unsigned char)packet_id;
        }
        if (level == V5) *p++ = 0;
        memcpy(p, payload.buf, (size_t)payload.len);
    }
    PyBuffer_Release(&payload);
    return out;
}

static PyMethodDef methods[] = {
    {"read_run", (PyCFunction)(void (*)(void))read_run_py, METH_FASTCALL,
     "A connected client's plain PUBLISH and PUBACK packets; the offset of the first that is not (see the module)."},
    {"encode_publish", encode_publish, METH_VARARGS, "A PUBLISH without properties (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mqtt", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mqtt(void) { return PyModule_Create(&module); }

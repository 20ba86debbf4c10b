/* The partition log's record loop in C (``streamlog.py`` holds the format and the reference code).

scan(data, pos, expected_offset, remaining, start_position, record_class, out)
    -> (pos, expected_offset, remaining)

Reads records from ``data[pos:]`` into ``out`` (``record_class`` instances: offset, timestamp_ms,
payload, position, size) while each one is whole and sound: its header all there, its length within
the limits, the record all there, its crc right, its offset the expected one (when ``expected_offset``
is not None). It stops before the first record that is not, or once ``remaining`` reached 0 (-1: no
bound), and returns where it stopped: the Python loop then says what is wrong exactly as it would
without this one.

encode(offset, timestamp_ms, payload) -> bytes | None
    The record ``streamlog.encode_record`` makes, or None for anything but the plain case (a value out
    of range, a payload that is not bytes): the Python encoder then raises what it always raised. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <zlib.h>

#include "bigendian.h"

#define HEADER_SIZE 24 /* length, crc, offset, time */
#define AFTER_CRC 16   /* offset, time */
#define MAX_RECORD_BYTES (64 * 1024 * 1024)




static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyBytes_Check(args[0]) || !PyType_Check(args[5]) ||
        !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type) || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "scan(bytes, pos, expected_offset, remaining, start_position, tuple type, list)");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    int checked = args[2] != Py_None;
    unsigned long long expected = 0;
    if (checked) {
        expected = PyLong_AsUnsignedLongLong(args[2]);
        if (PyErr_Occurred()) {  /* a negative or huge expectation: Python's loop says so */
            PyErr_Clear();
            return Py_BuildValue("(nOn)", pos, args[2], PyLong_AsSsize_t(args[3]));
        }
    }
    Py_ssize_t remaining = PyLong_AsSsize_t(args[3]);
    Py_ssize_t start_position = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "pos is outside the buffer");
        return NULL;
    }
    PyTypeObject *record_type = (PyTypeObject *)args[5];
    PyObject *out = args[6];
    int wrapped = 0; /* the last offset read was 2**64 - 1: no record can follow it */

    while (pos < end && remaining != 0) {
        if (end - pos < HEADER_SIZE) break;
        const unsigned char *record = data + pos;
        uint32_t length = be32(record);
        if (length < AFTER_CRC || length > MAX_RECORD_BYTES) break;
        Py_ssize_t stop = pos + 8 + (Py_ssize_t)length;
        if (stop > end) break;
        if (crc32_z(0L, record + 8, (z_size_t)length) != be32(record + 4)) break;
        uint64_t offset = be64(record + 8);
        if (checked && (offset != expected || wrapped)) break;
        PyObject *fields[5] = {
            PyLong_FromUnsignedLongLong(offset),
            PyLong_FromLongLong((long long)be64(record + 16)),
            PyBytes_FromStringAndSize((const char *)record + HEADER_SIZE, stop - pos - HEADER_SIZE),
            PyLong_FromSsize_t(start_position + pos),
            PyLong_FromSsize_t(stop - pos),
        };
        /* A tuple subclass made as tuple.__new__(record_type, fields) makes it: its items, no init. */
        PyObject *made = NULL;
        if (fields[0] && fields[1] && fields[2] && fields[3] && fields[4])
            made = record_type->tp_alloc(record_type, 5);
        if (made == NULL) {
            for (int i = 0; i < 5; i++) Py_XDECREF(fields[i]);
            return NULL;
        }
        for (int i = 0; i < 5; i++) PyTuple_SET_ITEM(made, i, fields[i]);
        int failed = PyList_Append(out, made);
        Py_DECREF(made);
        if (failed) return NULL;
        expected = offset + 1;
        wrapped = offset == UINT64_MAX;
        checked = 1;
        pos = stop;
        if (remaining > 0) remaining--;
    }
    PyObject *next;
    if (wrapped) {
        PyObject *last = PyLong_FromUnsignedLongLong(UINT64_MAX), *one = PyLong_FromLong(1);
        next = last && one ? PyNumber_Add(last, one) : NULL;
        Py_XDECREF(last);
        Py_XDECREF(one);
    } else {
        next = checked ? PyLong_FromUnsignedLongLong(expected) : Py_NewRef(Py_None);
    }
    if (next == NULL) return NULL;
    PyObject *result = Py_BuildValue("(nNn)", pos, next, remaining);
    return result;
}

static PyObject *encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode takes 3 arguments");
        return NULL;
    }
    if (!PyLong_Check(args[0]) || !PyLong_Check(args[1]) || !PyBytes_Check(args[2])) Py_RETURN_NONE;
    unsigned long long offset = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int overflow = 0;
    long long timestamp = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || (timestamp == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t payload_size = PyBytes_GET_SIZE(args[2]);
    if ((unsigned long long)payload_size + AFTER_CRC > 0xffffffffULL) Py_RETURN_NONE;
    PyObject *record = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + payload_size);
    if (record == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(record);
    put_be(p, (uint64_t)(AFTER_CRC + payload_size), 4);
    put_be(p + 8, offset, 8);
    put_be(p + 16, (uint64_t)timestamp, 8);
    memcpy(p + HEADER_SIZE, PyBytes_AS_STRING(args[2]), (size_t)payload_size);
    put_be(p + 4, crc32_z(0L, p + 8, (z_size_t)(AFTER_CRC + payload_size)), 4);
    return record;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "Whole, sound records from a buffer, until the first that is not (see the module)."},
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "The record streamlog.encode_record makes, or None where only Python says why not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&module); }

/* The mesh frame's layout (``frames.py`` holds it) and the direct path's run counting, for the C
   extensions that read or write frames (``mesh/_frames.c``, ``doors/_nats.c``). */

#ifndef MESHPLANE_FRAME_LAYOUT_H
#define MESHPLANE_FRAME_LAYOUT_H

#include <Python.h>

#define HEAD_BYTES 20   /* type, flags, source (16), subject length (2) */
#define SOURCE_BYTES 16
#define MIDDLE_BYTES 12 /* sequence (8), payload length (4) */
#define CRC_BYTES 4
#define STAMP_BYTES 8   /* an EVENT's payload starts with its timestamp */
#define EVENT_TYPE 3

/* (info, events, duplicates) appended to ``runs``: a run of consecutive events of one route entry. */
static int flush_run(PyObject *runs, PyObject *info, Py_ssize_t events, Py_ssize_t duplicates) {
    if (info == NULL || events == 0) return 0;
    PyObject *run = Py_BuildValue("(Onn)", info, events, duplicates);
    if (run == NULL) return -1;
    int failed = PyList_Append(runs, run);
    Py_DECREF(run);
    return failed;
}

#endif

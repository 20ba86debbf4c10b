/* The event plane's hot paths in C (optional: native.py falls back to pyzmq and Python).
 *
 * send_event() builds one event's frames straight into ZeroMQ messages: the envelope's MessagePack map
 * from a template fixed per publisher (native.py checks it against msgspec's own encoding before
 * using it), the sequence and the clock written in, then the frames sent without blocking;
 * send_events() does it for a list of payloads (publish_many) without returning to Python per event;
 * send_batches() sends a list as batch messages (core/batches.py), many events to a ZeroMQ message.
 *
 * receive() drains a SUB socket without blocking and, for the two common shapes under the subscriber's
 * own routing topic (the 8-byte-header layout's 2 frames, Dynamo's 4 frames), checks the framing and
 * decodes the body, so an event costs no Python bytecode until the intake: a body in msgspec's own
 * layout under the subscriber's topic is read here (envelope_map.h), any other goes to the decoder.
 * A batch message's events are read the same way, each item as an 8-byte-header event.
 * Anything else (other shapes, other topics, heartbeats, bad headers, undecodable bodies, a decoder
 * error of any kind) is handed back as its list of frames, and the Python decoders say what is wrong:
 * this file only ever takes the path where nothing is wrong, so it defines no error of its own.
 * decode_nats() does the same for a batch of NATS messages (runs included).
 *
 * libzmq is the one pyzmq loaded: its functions arrive as addresses through bind() (native.py looks
 * them up with ctypes), so nothing here links against a libzmq of its own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../core/bigendian.h"
#include "../core/envelope_map.h"

/* zmq.h's zmq_msg_t: 64 opaque bytes, pointer-aligned (stable across libzmq 4.x). */
typedef struct {
    void *align;
    unsigned char rest[64 - sizeof(void *)];
} zmq_msg;

#define ZMQ_DONTWAIT_FLAG 1
#define ZMQ_SNDMORE_FLAG 2
#define HEADER8_SIZE 8
#define DYNAMO_HEADER_SIZE 5
#define INLINE_FRAMES 4

static int (*msg_init)(zmq_msg *);
static int (*msg_recv)(zmq_msg *, void *, int);
static int (*msg_close)(zmq_msg *);
static void *(*msg_data)(zmq_msg *);
static size_t (*msg_size)(const zmq_msg *);
static int (*msg_more)(const zmq_msg *);
static int (*zmq_errno_fn)(void);
static int (*msg_init_size)(zmq_msg *, size_t);
static int (*msg_send)(zmq_msg *, void *, int);
static int (*send_bytes)(void *, const void *, size_t, int);

static unsigned char header8_event_head[4]; /* version 2, event, MessagePack, no flags */
static PyObject *heartbeat_suffix;          /* str */
static PyObject *str_publisher_id, *str_sequence, *str_topic;

static int is_msgpack_map(unsigned char first) {
    return (first >= 0x80 && first <= 0x8f) || first == 0xde || first == 0xdf;
}



static PyObject *bind(PyObject *self, PyObject *args) {
    unsigned long long a[10];
    PyObject *head, *suffix;
    if (!PyArg_ParseTuple(args, "(KKKKKKKKKK)SU", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7], &a[8],
                          &a[9], &head, &suffix))
        return NULL;
    if (PyBytes_GET_SIZE(head) != 4) {
        PyErr_SetString(PyExc_ValueError, "the event head is 4 bytes");
        return NULL;
    }
    msg_init = (int (*)(zmq_msg *))(uintptr_t)a[0];
    msg_recv = (int (*)(zmq_msg *, void *, int))(uintptr_t)a[1];
    msg_close = (int (*)(zmq_msg *))(uintptr_t)a[2];
    msg_data = (void *(*)(zmq_msg *))(uintptr_t)a[3];
    msg_size = (size_t(*)(const zmq_msg *))(uintptr_t)a[4];
    msg_more = (int (*)(const zmq_msg *))(uintptr_t)a[5];
    zmq_errno_fn = (int (*)(void))(uintptr_t)a[6];
    msg_init_size = (int (*)(zmq_msg *, size_t))(uintptr_t)a[7];
    msg_send = (int (*)(zmq_msg *, void *, int))(uintptr_t)a[8];
    send_bytes = (int (*)(void *, const void *, size_t, int))(uintptr_t)a[9];
    memcpy(header8_event_head, PyBytes_AS_STRING(head), 4);
    Py_INCREF(suffix);
    Py_XSETREF(heartbeat_suffix, suffix);
    Py_RETURN_NONE;
}

/* The envelope if the body decodes, else NULL with no exception set (the frames go the slow way). */
static PyObject *decode_body(PyObject *decode, const unsigned char *body, size_t size) {
    PyObject *data = PyBytes_FromStringAndSize((const char *)body, (Py_ssize_t)size);
    if (data == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *envelope = PyObject_CallOneArg(decode, data);
    Py_DECREF(data);
    if (envelope == NULL) PyErr_Clear();
    return envelope;
}

/* What a subscriber's events are: its EventEnvelope type and its topic, as str and as UTF-8. */
typedef struct {
    PyObject *type, *topic;
    const char *topic_utf8;
    size_t topic_size;
} expected_envelope;

/* The envelope of a body in msgspec's own layout under the expected topic, built without the decoder;
 * NULL (no exception set) for any other body, or out of memory (then the decoder has its turn). */
static PyObject *canonical_envelope(const expected_envelope *expected, const unsigned char *body, size_t size,
                                    envelope_view *view) {
    if (expected == NULL || !read_envelope_map(body, size, view) || view->topic_size != expected->topic_size ||
        memcmp(view->topic, expected->topic_utf8, view->topic_size) != 0)
        return NULL;
    PyObject *args[5] = {PyLong_FromUnsignedLongLong(view->publisher_id),
                         PyLong_FromUnsignedLongLong(view->sequence),
                         PyLong_FromUnsignedLongLong(view->published_at), expected->topic,
                         PyBytes_FromStringAndSize((const char *)view->payload, (Py_ssize_t)view->payload_size)};
    PyObject *envelope = NULL;
    if (args[0] != NULL && args[1] != NULL && args[2] != NULL && args[4] != NULL)
        envelope = PyObject_Vectorcall(expected->type, args, 5, NULL);
    for (int i = 0; i < 5; i++)
        if (i != 3) Py_XDECREF(args[i]);
    if (envelope == NULL) PyErr_Clear();
    return envelope;
}

/* The envelope of an event's body: read here when canonical (*canonical set, fields in *view), else
 * decoded by `decode`; NULL (no exception set) when it does not decode. */
static PyObject *body_event(PyObject *decode, const expected_envelope *expected, const unsigned char *body,
                            size_t size, envelope_view *view, int *canonical) {
    PyObject *envelope = canonical_envelope(expected, body, size, view);
    *canonical = envelope != NULL;
    return envelope != NULL ? envelope : decode_body(decode, body, size);
}

static int attr_equals(PyObject *obj, PyObject *name, uint64_t expected) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        PyErr_Clear();
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    Py_DECREF(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return v == expected;
}

static int is_heartbeat_topic(PyObject *envelope) {
    PyObject *topic = PyObject_GetAttr(envelope, str_topic);
    if (topic == NULL) {
        PyErr_Clear();
        return 1; /* let the slow path say what is wrong */
    }
    int tail = PyUnicode_Check(topic) ? (int)PyUnicode_Tailmatch(topic, heartbeat_suffix, 0, PY_SSIZE_T_MAX, 1) : 1;
    Py_DECREF(topic);
    if (tail < 0) {
        PyErr_Clear();
        return 1;
    }
    return tail;
}

/* The event of an 8-byte-header message (version 2, an event, MessagePack, no flags, the length as
 * announced, a map within max_bytes); NULL otherwise (no exception set). */
static PyObject *header8_event(const unsigned char *data, size_t size, size_t max_bytes, PyObject *decode,
                               const expected_envelope *expected, envelope_view *view, int *canonical) {
    if (size <= HEADER8_SIZE || size - HEADER8_SIZE > max_bytes) return NULL;
    if (memcmp(data, header8_event_head, 4) != 0 || be32(data + 4) != size - HEADER8_SIZE) return NULL;
    if (!is_msgpack_map(data[HEADER8_SIZE])) return NULL;
    return body_event(decode, expected, data + HEADER8_SIZE, size - HEADER8_SIZE, view, canonical);
}

/* The event in frames[0..count), if the message is one of the two common shapes under `topic` and
 * nothing about it is unusual; NULL otherwise (no exception set). *canonical says whether it was read
 * here under the expected topic (body_event). */
static PyObject *fast_event(zmq_msg *frames, int count, const char *topic, size_t topic_size, size_t max_bytes,
                            PyObject *decode, const expected_envelope *expected, envelope_view *view,
                            int *canonical) {
    *canonical = 0;
    if (msg_size(&frames[0]) != topic_size || memcmp(msg_data(&frames[0]), topic, topic_size) != 0)
        return NULL;
    if (count == 2)
        return header8_event(msg_data(&frames[1]), msg_size(&frames[1]), max_bytes, decode, expected, view,
                             canonical);
    if (count == 4) {
        const unsigned char *data = msg_data(&frames[3]);
        size_t size = msg_size(&frames[3]);
        if (msg_size(&frames[1]) != 8 || msg_size(&frames[2]) != 8) return NULL;
        if (size <= DYNAMO_HEADER_SIZE || size - DYNAMO_HEADER_SIZE > max_bytes) return NULL;
        if (data[0] != 1 || be32(data + 1) != size - DYNAMO_HEADER_SIZE) return NULL;
        if (!is_msgpack_map(data[DYNAMO_HEADER_SIZE])) return NULL;
        PyObject *envelope = body_event(decode, expected, data + DYNAMO_HEADER_SIZE, size - DYNAMO_HEADER_SIZE,
                                        view, canonical);
        if (envelope == NULL) return NULL;
        if (*canonical) { /* the expected topic is never a heartbeat's (native.py) */
            if (view->publisher_id == be64(msg_data(&frames[1])) && view->sequence == be64(msg_data(&frames[2])))
                return envelope;
            *canonical = 0;
            Py_DECREF(envelope);
            return NULL;
        }
        if (!attr_equals(envelope, str_publisher_id, be64(msg_data(&frames[1]))) ||
            !attr_equals(envelope, str_sequence, be64(msg_data(&frames[2]))) || is_heartbeat_topic(envelope)) {
            Py_DECREF(envelope);
            return NULL;
        }
        return envelope;
    }
    return NULL;
}

/* Whether what one call returns is one publisher's consecutive events, read here (`run` in receive). */
typedef struct {
    int state; /* 0: nothing yet, 1: one publisher's consecutive events so far, -1: anything else */
    uint64_t publisher, first, next;
} run_state;

static void run_add(run_state *run, int canonical, const envelope_view *view) {
    if (!canonical) {
        run->state = -1;
    } else if (run->state == 0) {
        *run = (run_state){1, view->publisher_id, view->sequence, view->sequence + 1};
    } else if (run->state == 1 && view->publisher_id == run->publisher && view->sequence == run->next &&
               run->next != 0) {
        run->next++;
    } else {
        run->state = -1;
    }
}

/* The envelope a NATS message carries, when it is the common case: Dynamo's bare MessagePack map, or
 * the 8-byte header of an event in MessagePack; NULL otherwise (no exception set). *canonical says
 * whether it was read here under the expected topic (body_event). */
static PyObject *fast_nats_event(PyObject *data, size_t max_bytes, PyObject *decode,
                                 const expected_envelope *expected, envelope_view *view, int *canonical) {
    const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(data);
    size_t size = (size_t)PyBytes_GET_SIZE(data);
    PyObject *envelope;
    *canonical = 0;
    if (size > 0 && is_msgpack_map(bytes[0])) {
        if (size > max_bytes) return NULL;
        /* under the expected topic, never a Dynamo heartbeat's (native.py) */
        envelope = canonical_envelope(expected, bytes, size, view);
        if (envelope != NULL) {
            *canonical = 1;
            return envelope;
        }
        envelope = PyObject_CallOneArg(decode, data); /* the message itself: no copy */
        if (envelope == NULL) {
            PyErr_Clear();
            return NULL;
        }
    } else {
        /* a version-2 heartbeat has its own message type: what this decodes is an event */
        return header8_event(bytes, size, max_bytes, decode, expected, view, canonical);
    }
    if (is_heartbeat_topic(envelope)) { /* Dynamo's heartbeats are told by their topic */
        Py_DECREF(envelope);
        return NULL;
    }
    return envelope;
}

/* `expected` (None, or (EventEnvelope, topic, topic as UTF-8)) into *storage; NULL for None. */
static const expected_envelope *expected_arg(PyObject *arg, expected_envelope *storage) {
    if (arg == Py_None) return NULL;
    PyObject *utf8 = PyTuple_GET_ITEM(arg, 2);
    *storage = (expected_envelope){PyTuple_GET_ITEM(arg, 0), PyTuple_GET_ITEM(arg, 1), PyBytes_AS_STRING(utf8),
                                   (size_t)PyBytes_GET_SIZE(utf8)};
    return storage;
}

static int expected_ok(PyObject *arg) {
    return arg == Py_None || (PyTuple_Check(arg) && PyTuple_GET_SIZE(arg) == 3 &&
                              PyType_Check(PyTuple_GET_ITEM(arg, 0)) && PyUnicode_Check(PyTuple_GET_ITEM(arg, 1)) &&
                              PyBytes_Check(PyTuple_GET_ITEM(arg, 2)));
}

static PyObject *with_run(Py_ssize_t unusual, int error, const run_state *run, int with_error) {
    if (run->state == 1)
        return with_error ? Py_BuildValue("ni(KK)", unusual, error, run->publisher, run->first)
                          : Py_BuildValue("n(KK)", unusual, run->publisher, run->first);
    return with_error ? Py_BuildValue("niO", unusual, error, Py_None) : Py_BuildValue("nO", unusual, Py_None);
}

/* decode_nats(messages, max_bytes, decode, out, expected) -> (unusual, run)
 *
 * Appends to `out`, for each message (bytes) of a NATS subscriber's own subject, its envelope when it
 * is a common event, else the message itself, for the Python decoder (`unusual` counts those).
 * `expected` and `run` as in receive. */
static PyObject *decode_nats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0]) || !PyList_Check(args[3]) || !expected_ok(args[4])) {
        PyErr_SetString(PyExc_TypeError, "decode_nats(messages, max_bytes, decode, out, expected)");
        return NULL;
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[1]);
    if (max_bytes == -1 && PyErr_Occurred()) return NULL;
    PyObject *messages = args[0], *decode = args[2], *out = args[3];
    expected_envelope storage;
    const expected_envelope *expected = expected_arg(args[4], &storage);
    Py_ssize_t unusual = 0;
    run_state run = {0, 0, 0, 0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        PyObject *data = PyList_GET_ITEM(messages, i);
        envelope_view view;
        int canonical = 0;
        PyObject *item = PyBytes_CheckExact(data)
                             ? fast_nats_event(data, (size_t)max_bytes, decode, expected, &view, &canonical)
                             : NULL;
        if (item == NULL) {
            item = Py_NewRef(data);
            unusual++;
        }
        run_add(&run, canonical, &view);
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed) return NULL;
    }
    return with_run(unusual, 0, &run, 0);
}

static PyObject *frame_bytes(zmq_msg *frame) {
    return PyBytes_FromStringAndSize((const char *)msg_data(frame), (Py_ssize_t)msg_size(frame));
}

/* The frames as a list of bytes, receiving the rest of the message when it has more than we hold. */
static PyObject *frame_list(zmq_msg *frames, int count, void *socket, int *recv_errno) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    int more = 0;
    for (int i = 0; i < count; i++) {
        PyObject *item = frame_bytes(&frames[i]);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
        more = msg_more(&frames[i]);
    }
    while (more) {
        zmq_msg frame;
        msg_init(&frame);
        if (msg_recv(&frame, socket, ZMQ_DONTWAIT_FLAG) < 0) {
            *recv_errno = zmq_errno_fn();
            msg_close(&frame);
            break; /* never happens (a message arrives whole); the short list is refused upstream */
        }
        more = msg_more(&frame);
        PyObject *item = frame_bytes(&frame);
        msg_close(&frame);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

/* A batch message's items (core/batches.py), each a common event, appended to `out` with the run
 * followed; 0 when any item is not (then nothing was appended and *run is as it was: the whole message
 * goes to the Python decoders). */
static int batch_events(const unsigned char *data, size_t size, size_t max_bytes, PyObject *decode,
                        const expected_envelope *expected, PyObject *out, run_state *run) {
    Py_ssize_t appended = PyList_GET_SIZE(out);
    run_state before = *run;
    int ok = size > 0;
    while (ok && size > 0) {
        size_t item = size <= HEADER8_SIZE ? 0 : HEADER8_SIZE + (size_t)be32(data + 4);
        int canonical = 0;
        envelope_view view;
        PyObject *event = item == 0 || item > size
                              ? NULL
                              : header8_event(data, item, max_bytes, decode, expected, &view, &canonical);
        ok = event != NULL && PyList_Append(out, event) == 0;
        Py_XDECREF(event);
        run_add(run, canonical, &view);
        data += item;
        size -= ok ? item : size;
    }
    if (!ok) {
        PyErr_Clear();
        PyList_SetSlice(out, appended, PY_SSIZE_T_MAX, NULL);
        *run = before;
    }
    return ok;
}

/* receive(socket_address, topic, max_bytes, max_messages, decode, out, expected, batch_topic)
 *     -> (unusual, errno, run)
 *
 * Appends to `out` up to max_messages items: an envelope for each common event, a list of frames
 * for anything else (`unusual` counts those). errno is 0 when max_messages were read, else the error
 * that ended the batch (EAGAIN when the socket is drained). `expected` is (EventEnvelope, topic,
 * topic as UTF-8) or None; `run` is (publisher_id, first_sequence) when every item is an envelope of
 * the expected topic read here and they are that publisher's consecutive events, else None. A batch
 * message under `batch_topic` (bytes, or None where the subscriber takes no batches) appends its events
 * when every item is a common one, else its frames; reading stops once `out` holds max_messages. */
static PyObject *receive(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyBytes_Check(args[1]) || !PyList_Check(args[5]) || !expected_ok(args[6]) ||
        (args[7] != Py_None && !PyBytes_Check(args[7]))) {
        PyErr_SetString(PyExc_TypeError,
                        "receive(socket_address, topic, max_bytes, max_messages, decode, out, expected, "
                        "batch_topic)");
        return NULL;
    }
    if (msg_recv == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() was not called");
        return NULL;
    }
    void *socket = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_messages = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    const char *topic = PyBytes_AS_STRING(args[1]);
    size_t topic_size = (size_t)PyBytes_GET_SIZE(args[1]);
    PyObject *decode = args[4], *out = args[5];
    expected_envelope storage;
    const expected_envelope *expected = expected_arg(args[6], &storage);
    const char *batch = args[7] == Py_None ? NULL : PyBytes_AS_STRING(args[7]);
    size_t batch_size = batch == NULL ? 0 : (size_t)PyBytes_GET_SIZE(args[7]);
    Py_ssize_t unusual = 0;
    int recv_errno = 0;
    run_state run = {0, 0, 0, 0};
    while (PyList_GET_SIZE(out) < max_messages && recv_errno == 0) {
        zmq_msg frames[INLINE_FRAMES];
        int count = 0, more = 1, canonical = 0;
        envelope_view view;
        while (more && count < INLINE_FRAMES) {
            msg_init(&frames[count]);
            if (msg_recv(&frames[count], socket, ZMQ_DONTWAIT_FLAG) < 0) {
                recv_errno = zmq_errno_fn();
                msg_close(&frames[count]);
                break;
            }
            more = msg_more(&frames[count]);
            count++;
        }
        if (count == 0) break;
        if (!more && count == 2 && batch != NULL && msg_size(&frames[0]) == batch_size &&
            memcmp(msg_data(&frames[0]), batch, batch_size) == 0 &&
            batch_events(msg_data(&frames[1]), msg_size(&frames[1]), (size_t)max_bytes, decode, expected, out,
                         &run)) {
            for (int i = 0; i < count; i++) msg_close(&frames[i]);
            continue;
        }
        PyObject *item = more ? NULL
                              : fast_event(frames, count, topic, topic_size, (size_t)max_bytes, decode, expected,
                                           &view, &canonical);
        if (item == NULL) {
            item = frame_list(frames, count, socket, &recv_errno);
            unusual++;
        }
        for (int i = 0; i < count; i++) msg_close(&frames[i]);
        run_add(&run, canonical, &view);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            return NULL; /* out of memory: what was appended stays in `out` */
        }
        Py_DECREF(item);
    }
    return with_run(unusual, recv_errno, &run, 1);
}


/* MessagePack's smallest encoding of an unsigned integer, as msgspec writes it. */
static int uint_bytes(uint64_t v) { return v < 0x80 ? 0 : v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffULL ? 4 : 8; }

static size_t put_uint(unsigned char *p, uint64_t v) {
    int bytes = uint_bytes(v);
    if (bytes == 0) {
        p[0] = (unsigned char)v;
        return 1;
    }
    p[0] = bytes == 1 ? 0xcc : bytes == 2 ? 0xcd : bytes == 4 ? 0xce : 0xcf;
    for (int i = 0; i < bytes; i++) p[1 + i] = (unsigned char)(v >> (8 * (bytes - 1 - i)));
    return 1 + (size_t)bytes;
}

static size_t bin_header_size(size_t n) { return n <= 0xff ? 2 : n <= 0xffff ? 3 : 5; }

static size_t put_bin_header(unsigned char *p, size_t n) {
    if (n <= 0xff) {
        p[0] = 0xc4;
        p[1] = (unsigned char)n;
        return 2;
    }
    if (n <= 0xffff) {
        p[0] = 0xc5;
        p[1] = (unsigned char)(n >> 8);
        p[2] = (unsigned char)n;
        return 3;
    }
    p[0] = 0xc6;
    for (int i = 0; i < 4; i++) p[1 + i] = (unsigned char)(n >> (8 * (3 - i)));
    return 5;
}


static uint64_t unix_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
}

/* A send failed after the message's first frame went (ZeroMQ accepts a message's frames together, so
 * only ETERM or ENOMEM): the socket is mid-message and sending it again would corrupt it; raise. */
static PyObject *mid_message_error(void) {
    errno = zmq_errno_fn();
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* An event's body: prefix, the sequence, middle, the clock, suffix, the payload as MessagePack bin. */
static size_t body_size(PyObject *const *template, uint64_t sequence, uint64_t now, size_t payload) {
    return (size_t)PyBytes_GET_SIZE(template[2]) + 1 + (size_t)uint_bytes(sequence) +
           (size_t)PyBytes_GET_SIZE(template[3]) + 1 + (size_t)uint_bytes(now) + (size_t)PyBytes_GET_SIZE(template[4]) +
           bin_header_size(payload) + payload;
}

static unsigned char *write_body(unsigned char *p, PyObject *const *template, uint64_t sequence, uint64_t now,
                                 PyObject *payload_bytes) {
    size_t payload = (size_t)PyBytes_GET_SIZE(payload_bytes);
    for (int part = 2; part <= 4; part++) {
        memcpy(p, PyBytes_AS_STRING(template[part]), (size_t)PyBytes_GET_SIZE(template[part]));
        p += PyBytes_GET_SIZE(template[part]);
        if (part == 2) p += put_uint(p, sequence);
        if (part == 3) p += put_uint(p, now);
    }
    p += put_bin_header(p, payload);
    memcpy(p, PyBytes_AS_STRING(payload_bytes), payload);
    return p + payload;
}

/* One event's frames: the frame template (topic, pid_frame, prefix, middle, suffix, checked by the
 * callers) with the sequence, the clock and the payload written in. Returns 0 when sent, the errno of
 * the first frame's send when nothing was sent, or -1 with OSError set when a later frame failed. */
static int send_one(void *socket, PyObject *const *template, uint64_t sequence, PyObject *payload_bytes) {
    PyObject *topic = template[0], *pid_frame = template[1];
    int dynamo = pid_frame != Py_None;
    size_t head = dynamo ? DYNAMO_HEADER_SIZE : HEADER8_SIZE;
    uint64_t now = unix_ms();
    size_t body = body_size(template, sequence, now, (size_t)PyBytes_GET_SIZE(payload_bytes));
    if (body > 0xffffffffULL) return EMSGSIZE; /* the 4-byte length cannot say it */

    if (send_bytes(socket, PyBytes_AS_STRING(topic), (size_t)PyBytes_GET_SIZE(topic),
                   ZMQ_SNDMORE_FLAG | ZMQ_DONTWAIT_FLAG) < 0)
        return zmq_errno_fn();
    int more = ZMQ_SNDMORE_FLAG | ZMQ_DONTWAIT_FLAG;
    if (dynamo) {
        unsigned char seq_frame[8];
        put_be(seq_frame, sequence, 8);
        if (send_bytes(socket, PyBytes_AS_STRING(pid_frame), 8, more) < 0 || send_bytes(socket, seq_frame, 8, more) < 0) {
            mid_message_error();
            return -1;
        }
    }
    zmq_msg message;
    if (msg_init_size(&message, head + body) < 0) {
        mid_message_error();
        return -1;
    }
    unsigned char *start = msg_data(&message);
    write_body(start + head, template, sequence, now, payload_bytes);
    if (dynamo) {
        start[0] = 1;
        put_be(start + 1, body, 4);
    } else {
        memcpy(start, header8_event_head, 4);
        put_be(start + 4, body, 4);
    }
    int rc = msg_send(&message, socket, ZMQ_DONTWAIT_FLAG);
    msg_close(&message);
    if (rc < 0) {
        mid_message_error();
        return -1;
    }
    return 0;
}

/* The frame template's arguments (args[1] to args[5]) as send_one takes them. */
static int template_ok(PyObject *const *args) {
    return PyBytes_Check(args[1]) && (args[2] == Py_None || (PyBytes_Check(args[2]) && PyBytes_GET_SIZE(args[2]) == 8)) &&
           PyBytes_Check(args[3]) && PyBytes_Check(args[4]) && PyBytes_Check(args[5]);
}

/* send_event(socket_address, topic, pid_frame, prefix, middle, suffix, sequence, payload) -> errno
 *
 * One event: with pid_frame None the 8-byte-header layout (topic, header + body), else Dynamo's
 * (topic, publisher id, sequence, version + length + body). The body is prefix, the sequence, middle,
 * the current Unix milliseconds, suffix and the payload as MessagePack bin. Returns 0 when sent, else
 * the errno of the first frame's send, before anything was sent (EAGAIN: the queue is full under
 * XPUB_NODROP); the caller then takes pyzmq's path, which waits or raises. A failure after the first
 * frame raises OSError. */
static PyObject *send_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !template_ok(args) || !PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "send_event(socket_address, topic, pid_frame, prefix, middle, suffix, sequence, payload)");
        return NULL;
    }
    void *socket = PyLong_AsVoidPtr(args[0]);
    uint64_t sequence = PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    int rc = send_one(socket, args + 1, sequence, args[7]);
    return rc < 0 ? NULL : PyLong_FromLong(rc);
}

/* The list arguments of send_events and send_batches (first_sequence, payloads, start at args[6..8]):
 * 0 with *first, *start and *count set, or -1 with an exception set. */
static int list_args(PyObject *const *args, const char *name, uint64_t *first, Py_ssize_t *start,
                     Py_ssize_t *count) {
    *first = PyLong_AsUnsignedLongLong(args[6]);
    *start = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred()) return -1;
    *count = PyList_GET_SIZE(args[7]);
    if (*start < 0 || *start > *count) {
        PyErr_Format(PyExc_IndexError, "%s: start is outside the payloads", name);
        return -1;
    }
    for (Py_ssize_t i = *start; i < *count; i++)
        if (!PyBytes_Check(PyList_GET_ITEM(args[7], i))) {
            PyErr_Format(PyExc_TypeError, "%s: every payload must be bytes", name);
            return -1;
        }
    return 0;
}

/* send_events(socket_address, topic, pid_frame, prefix, middle, suffix, first_sequence, payloads, start)
 *     -> (sent, errno)
 *
 * payloads[start:], each as send_event sends it, payloads[i] with sequence first_sequence + i, until one
 * is refused before anything of it was sent: returns how many were sent and that errno (0 when all
 * were). A failure after an event's first frame raises OSError, as in send_event. */
static PyObject *send_events(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !template_ok(args) || !PyList_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "send_events(socket_address, topic, pid_frame, prefix, middle, suffix, "
                                         "first_sequence, payloads, start)");
        return NULL;
    }
    void *socket = PyLong_AsVoidPtr(args[0]);
    uint64_t first;
    Py_ssize_t start, count;
    if (PyErr_Occurred() || list_args(args, "send_events", &first, &start, &count) < 0) return NULL;
    for (Py_ssize_t i = start; i < count; i++) {
        int rc = send_one(socket, args + 1, first + (uint64_t)i, PyList_GET_ITEM(args[7], i));
        if (rc < 0) return NULL;
        if (rc > 0) return Py_BuildValue("ni", i - start, rc);
    }
    return Py_BuildValue("ni", count - start, 0);
}

/* send_batches(socket_address, batch_topic, None, prefix, middle, suffix, first_sequence, payloads, start,
 *              batch_bytes) -> (sent, errno)
 *
 * payloads[start:] as batch messages (core/batches.py): frames (batch_topic, items), the items being the
 * events in the 8-byte-header layout back to back, as many as fit in batch_bytes (one at least).
 * Returns as send_events does: a batch refused before anything of it was sent ends the call. */
static PyObject *send_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10 || !template_ok(args) || args[2] != Py_None || !PyList_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "send_batches(socket_address, batch_topic, None, prefix, middle, suffix, "
                                         "first_sequence, payloads, start, batch_bytes)");
        return NULL;
    }
    void *socket = PyLong_AsVoidPtr(args[0]);
    size_t batch_bytes = PyLong_AsSize_t(args[9]);
    uint64_t first;
    Py_ssize_t start, count;
    if (PyErr_Occurred() || list_args(args, "send_batches", &first, &start, &count) < 0) return NULL;
    PyObject *payloads = args[7], *topic = args[1];
    uint64_t now = unix_ms();
    Py_ssize_t i = start;
    while (i < count) {
        /* as many events as fit, one at least */
        size_t total = 0;
        Py_ssize_t end = i;
        while (end < count) {
            size_t item = HEADER8_SIZE + body_size(args + 1, first + (uint64_t)end, now,
                                                   (size_t)PyBytes_GET_SIZE(PyList_GET_ITEM(payloads, end)));
            if (item - HEADER8_SIZE > 0xffffffffULL) return Py_BuildValue("ni", i - start, EMSGSIZE);
            if (end > i && total + item > batch_bytes) break;
            total += item;
            end++;
        }
        if (send_bytes(socket, PyBytes_AS_STRING(topic), (size_t)PyBytes_GET_SIZE(topic),
                       ZMQ_SNDMORE_FLAG | ZMQ_DONTWAIT_FLAG) < 0)
            return Py_BuildValue("ni", i - start, zmq_errno_fn());
        zmq_msg message;
        if (msg_init_size(&message, total) < 0) return mid_message_error();
        unsigned char *p = msg_data(&message);
        for (Py_ssize_t k = i; k < end; k++) {
            unsigned char *body = p + HEADER8_SIZE;
            p = write_body(body, args + 1, first + (uint64_t)k, now, PyList_GET_ITEM(payloads, k));
            memcpy(body - HEADER8_SIZE, header8_event_head, 4);
            put_be(body - 4, (uint64_t)(p - body), 4);
        }
        int rc = msg_send(&message, socket, ZMQ_DONTWAIT_FLAG);
        msg_close(&message);
        if (rc < 0) return mid_message_error();
        i = end;
    }
    return Py_BuildValue("ni", count - start, 0);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind((10 libzmq function addresses), event head, heartbeat suffix)"},
    {"decode_nats", (PyCFunction)(void (*)(void))decode_nats, METH_FASTCALL,
     "decode_nats(messages, max_bytes, decode, out, expected) -> (unusual, run)"},
    {"send_event", (PyCFunction)(void (*)(void))send_event, METH_FASTCALL,
     "send_event(socket_address, topic, pid_frame, prefix, middle, suffix, sequence, payload) -> errno"},
    {"send_events", (PyCFunction)(void (*)(void))send_events, METH_FASTCALL,
     "send_events(socket_address, topic, pid_frame, prefix, middle, suffix, first_sequence, payloads, start)"
     " -> (sent, errno)"},
    {"send_batches", (PyCFunction)(void (*)(void))send_batches, METH_FASTCALL,
     "send_batches(socket_address, batch_topic, None, prefix, middle, suffix, first_sequence, payloads, start,"
     " batch_bytes) -> (sent, errno)"},
    {"receive", (PyCFunction)(void (*)(void))receive, METH_FASTCALL,
     "receive(socket_address, topic, max_bytes, max_messages, decode, out, expected, batch_topic)"
     " -> (unusual, errno, run)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    str_publisher_id = PyUnicode_InternFromString("publisher_id");
    str_sequence = PyUnicode_InternFromString("sequence");
    str_topic = PyUnicode_InternFromString("topic");
    if (str_publisher_id == NULL || str_sequence == NULL || str_topic == NULL) return NULL;
    return PyModule_Create(&module);
}

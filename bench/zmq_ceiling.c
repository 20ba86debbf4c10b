/* The ceiling of ZeroMQ on this machine, measured as libzmq's own perf/local_thr and remote_thr do:
 * one process PUSHes COUNT messages of SIZE bytes over TCP loopback, another PULLs them; the rate is
 * counted from the first message received to the last. bench/zmq_ceiling.py builds it against the
 * libzmq that pyzmq loads (the one meshplane runs on) and runs both sides.
 *
 * With TOPIC, messages travel as an event of meshplane's 8-byte-header layout does: PUB to SUB, a
 * topic frame the SUB socket filters on, then a body of SIZE bytes (nothing dropped: XPUB_NODROP, and
 * the sender waits for room).
 *
 *   zmq_ceiling local tcp://127.0.0.1:*  SIZE COUNT [TOPIC]   prints its endpoint, then one JSON line
 *   zmq_ceiling remote ENDPOINT SIZE COUNT [TOPIC]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(const char *what) {
    fprintf(stderr, "zmq_ceiling: %s: %s\n", what, zmq_strerror(zmq_errno()));
    return 1;
}

/* One message (its frames, when a topic frame comes first); its last frame is left in msg. */
static int receive(void *socket, zmq_msg_t *msg) {
    do {
        zmq_msg_init(msg);
        if (zmq_msg_recv(msg, socket, 0) < 0) return fail("recv");
        if (!zmq_msg_more(msg)) return 0;
        zmq_msg_close(msg);
    } while (1);
}

static int pull(void *socket, size_t size, long count) {
    zmq_msg_t msg;
    double started = 0.0;
    for (long i = 0; i < count; i++) {
        if (receive(socket, &msg) != 0) return 1;
        if (zmq_msg_size(&msg) != size) {
            fprintf(stderr, "zmq_ceiling: a message of %zu bytes, not %zu\n", zmq_msg_size(&msg), size);
            return 1;
        }
        if (i == 0) started = now();
        zmq_msg_close(&msg);
    }
    double elapsed = now() - started;
    printf("{\"messages\": %ld, \"size\": %zu, \"seconds\": %.6f, \"rate\": %.0f}\n", count, size, elapsed,
           (double)(count - 1) / elapsed);
    return 0;
}

/* Sends a frame, waiting for room where a full subscriber's queue refuses it (XPUB_NODROP). */
static int send_frame(void *socket, const char *fill, size_t size, int flags) {
    zmq_msg_t msg;
    for (;;) {
        if (zmq_msg_init_size(&msg, size) != 0) return fail("msg_init_size");
        if (fill != NULL) memcpy(zmq_msg_data(&msg), fill, size);
        else memset(zmq_msg_data(&msg), 'x', size);
        if (zmq_msg_send(&msg, socket, flags) >= 0) return 0;
        zmq_msg_close(&msg);
        if (zmq_errno() != EAGAIN) return fail("send");
        zmq_pollitem_t item = {socket, 0, ZMQ_POLLOUT, 0};
        if (zmq_poll(&item, 1, -1) < 0) return fail("poll");
    }
}

static int push(void *socket, size_t size, long count, const char *topic) {
    if (topic != NULL) { /* wait for the subscription, as a publisher that counts its subscribers */
        zmq_msg_t subscription;
        zmq_msg_init(&subscription);
        if (zmq_msg_recv(&subscription, socket, 0) < 0) return fail("subscription");
        zmq_msg_close(&subscription);
    }
    for (long i = 0; i < count; i++) {
        if (topic != NULL && send_frame(socket, topic, strlen(topic), ZMQ_SNDMORE) != 0) return 1;
        if (send_frame(socket, NULL, size, 0) != 0) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if ((argc != 5 && argc != 6) || (strcmp(argv[1], "local") != 0 && strcmp(argv[1], "remote") != 0)) {
        fprintf(stderr, "usage: %s local|remote ENDPOINT SIZE COUNT [TOPIC]\n", argv[0]);
        return 2;
    }
    int local = strcmp(argv[1], "local") == 0;
    size_t size = strtoul(argv[3], NULL, 10);
    long count = strtol(argv[4], NULL, 10);
    const char *topic = argc == 6 ? argv[5] : NULL;
    void *context = zmq_ctx_new();
    int type = topic == NULL ? (local ? ZMQ_PULL : ZMQ_PUSH) : (local ? ZMQ_SUB : ZMQ_XPUB);
    void *socket = zmq_socket(context, type);
    int rc, on = 1;
    if (topic != NULL && local && zmq_setsockopt(socket, ZMQ_SUBSCRIBE, topic, strlen(topic)) != 0)
        return fail("subscribe");
    if (topic != NULL && !local && zmq_setsockopt(socket, ZMQ_XPUB_NODROP, &on, sizeof on) != 0)
        return fail("nodrop");
    if (local) {
        char endpoint[256];
        size_t length = sizeof endpoint;
        if (zmq_bind(socket, argv[2]) != 0) return fail("bind");
        if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &length) != 0) return fail("endpoint");
        printf("%s\n", endpoint);
        fflush(stdout);
        rc = pull(socket, size, count);
    } else {
        if (zmq_connect(socket, argv[2]) != 0) return fail("connect");
        rc = push(socket, size, count, topic);
    }
    zmq_close(socket); /* the default linger: a pusher's close waits until all is sent */
    zmq_ctx_term(context);
    return rc;
}

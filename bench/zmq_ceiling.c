/* The ceiling of ZeroMQ on this machine, measured as libzmq's own perf/local_thr and remote_thr do:
 * one process PUSHes COUNT messages of SIZE bytes over TCP loopback, another PULLs them; the rate is
 * counted from the first message received to the last. bench/zmq_ceiling.py builds it against the
 * libzmq that pyzmq loads (the one meshplane runs on) and runs both sides.
 *
 *   zmq_ceiling local tcp://127.0.0.1:*  SIZE COUNT   prints its endpoint, then one JSON line
 *   zmq_ceiling remote ENDPOINT SIZE COUNT
 */
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

static int pull(void *socket, size_t size, long count) {
    zmq_msg_t msg;
    double started = 0.0;
    for (long i = 0; i < count; i++) {
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, socket, 0) < 0) return fail("recv");
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

static int push(void *socket, size_t size, long count) {
    zmq_msg_t msg;
    for (long i = 0; i < count; i++) {
        if (zmq_msg_init_size(&msg, size) != 0) return fail("msg_init_size");
        memset(zmq_msg_data(&msg), 'x', size);
        if (zmq_msg_send(&msg, socket, 0) < 0) return fail("send");
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[1], "local") != 0 && strcmp(argv[1], "remote") != 0)) {
        fprintf(stderr, "usage: %s local|remote ENDPOINT SIZE COUNT\n", argv[0]);
        return 2;
    }
    int local = strcmp(argv[1], "local") == 0;
    size_t size = strtoul(argv[3], NULL, 10);
    long count = strtol(argv[4], NULL, 10);
    void *context = zmq_ctx_new();
    void *socket = zmq_socket(context, local ? ZMQ_PULL : ZMQ_PUSH);
    int rc;
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
        rc = push(socket, size, count);
    }
    zmq_close(socket); /* the default linger: a pusher's close waits until all is sent */
    zmq_ctx_term(context);
    return rc;
}

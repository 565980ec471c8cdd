// Reads COUNT event streams (GET TARGET over HTTP/1.0) at once and checks what each received.
//
//   reader HOST PORT TARGET COUNT
//
// Prints "ready" once every stream's head has arrived (each is subscribed). Then reads until a
// line with a number N comes on standard input: from there it waits until every stream has N
// events (at most 30 s), and prints one line:
//
//   TOTAL SLOWEST FASTEST CUT DISORDERED DIFFERING
//
// events received in all, by the slowest and the fastest stream; streams the server ended or
// reset (a reader that falls behind is disconnected); streams whose ids did not rise; streams
// whose ids differ from the first stream's (count, last id and sum). A benchmark whose streams
// share a filter got everything exactly when SLOWEST = FASTEST = N and the rest are 0.
//
// One thread, epoll, 1 MiB reads: a Python selector of 100 streams fell behind on a loaded
// machine and the server disconnected its streams. Events are counted by their `id:` lines,
// wherever a read splits them (counting "\nevent: " in each read missed those split in two).
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct stream {
    int fd;
    int open;
    int subscribed;
    int disordered;
    uint64_t count, last, sum;
    // The start of the line being read (what an `id:` line needs), and its length so far.
    char line[32];
    size_t line_length;
};

static double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

static void end_line(struct stream *stream) {
    size_t length = stream->line_length < sizeof stream->line ? stream->line_length : sizeof stream->line;
    stream->line_length = 0;
    if (!stream->subscribed) {
        // The blank line that ends the head (its lines end with CR LF).
        if (length == 1 && stream->line[0] == '\r') stream->subscribed = 1;
        return;
    }
    if (length < 5 || memcmp(stream->line, "id: ", 4) != 0) return;
    uint64_t id = 0;
    for (size_t i = 4; i < length && stream->line[i] >= '0' && stream->line[i] <= '9'; i++) id = id * 10 + (stream->line[i] - '0');
    if (stream->count > 0 && id <= stream->last) stream->disordered = 1;
    stream->count++;
    stream->last = id;
    stream->sum += id;
}

static void take(struct stream *stream, const char *bytes, size_t length) {
    while (length > 0) {
        const char *newline = memchr(bytes, '\n', length);
        size_t part = newline ? (size_t)(newline - bytes) : length;
        if (stream->line_length < sizeof stream->line) {
            size_t room = sizeof stream->line - stream->line_length;
            memcpy(stream->line + stream->line_length, bytes, part < room ? part : room);
        }
        stream->line_length += part;
        if (!newline) return;
        end_line(stream);
        bytes += part + 1;
        length -= part + 1;
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s HOST PORT TARGET COUNT\n", argv[0]);
        return 2;
    }
    int count = atoi(argv[4]);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *address;
    if (getaddrinfo(argv[1], argv[2], &hints, &address) != 0) {
        fprintf(stderr, "cannot resolve %s\n", argv[1]);
        return 1;
    }
    char request[4096];
    int request_length = snprintf(request, sizeof request, "GET %s HTTP/1.0\r\n\r\n", argv[3]);
    int poll = epoll_create1(0);
    struct stream *streams = calloc(count, sizeof *streams);
    for (int i = 0; i < count; i++) {
        int fd = socket(address->ai_family, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, address->ai_addr, address->ai_addrlen) != 0 || write(fd, request, request_length) != request_length) {
            perror("stream");
            return 1;
        }
        streams[i].fd = fd;
        streams[i].open = 1;
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(poll, EPOLL_CTL_ADD, fd, &event);
    }
    struct epoll_event input = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(poll, EPOLL_CTL_ADD, STDIN_FILENO, &input);

    static char buffer[1 << 20];
    int announced = 0;
    long long wanted = -1;
    double deadline = 0;
    for (;;) {
        if (!announced) {
            int subscribed = 0;
            for (int i = 0; i < count; i++) subscribed += streams[i].subscribed;
            if (subscribed == count) {
                printf("ready\n");
                fflush(stdout);
                announced = 1;
            }
        }
        if (wanted >= 0) {
            int done = 1;
            for (int i = 0; i < count && done; i++) done = !streams[i].open || streams[i].count >= (uint64_t)wanted;
            if (done || seconds() > deadline) break;
        }
        struct epoll_event events[256];
        int ready = epoll_wait(poll, events, 256, 100);
        if (ready < 0 && errno != EINTR) {
            perror("epoll_wait");
            return 1;
        }
        for (int e = 0; e < ready; e++) {
            if (events[e].data.u32 == UINT32_MAX) {
                char line[64] = {0};
                ssize_t length = read(STDIN_FILENO, line, sizeof line - 1);
                wanted = length > 0 ? atoll(line) : 0;
                deadline = seconds() + 30;
                epoll_ctl(poll, EPOLL_CTL_DEL, STDIN_FILENO, NULL);
                continue;
            }
            struct stream *stream = &streams[events[e].data.u32];
            ssize_t length = recv(stream->fd, buffer, sizeof buffer, 0);
            if (length > 0) {
                take(stream, buffer, (size_t)length);
            } else if (length == 0 || (errno != EAGAIN && errno != EINTR)) {
                stream->open = 0;
                epoll_ctl(poll, EPOLL_CTL_DEL, stream->fd, NULL);
                close(stream->fd);
            }
        }
    }
    uint64_t total = 0, slowest = UINT64_MAX, fastest = 0;
    int cut = 0, disordered = 0, differing = 0;
    for (int i = 0; i < count; i++) {
        struct stream *stream = &streams[i];
        total += stream->count;
        if (stream->count < slowest) slowest = stream->count;
        if (stream->count > fastest) fastest = stream->count;
        cut += !stream->open;
        disordered += stream->disordered;
        differing += stream->count != streams[0].count || stream->last != streams[0].last || stream->sum != streams[0].sum;
    }
    printf("%llu %llu %llu %d %d %d\n", (unsigned long long)total, (unsigned long long)(count ? slowest : 0),
           (unsigned long long)fastest, cut, disordered, differing);
    return 0;
}

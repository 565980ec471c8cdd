/*
 * The benchmarks' reference: the least a server on libuv and http_parser can do for the
 * service's two hottest calls. It parses each request with http_parser and answers with fixed
 * bytes of the same size and shape as the service's answers (a ~700-byte task), with a Date
 * header and keep-alive, and does nothing else. Figures for Taskloop are printed as ratios to
 * this server measured in the same run, so they do not swing with the machine.
 *
 *   GET  <any path>   200, the task JSON
 *   POST <any path>   201, Location, the task JSON (after the whole body is read)
 *
 * Prints `listening on http://127.0.0.1:PORT` (PORT from argv[1], 0 picks a free one).
 * Built by Benchmarks/reference/build.sh with the system's libuv and http_parser.
 */
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

static const char task_json[] =
    "{\"id\":\"01KAT0XB6R7E5V9H2G8M4N3P1Q\",\"name\":\"resize-images\",\"kind\":\"sleep\","
    "\"params\":{\"duration_ms\":1000},\"queue\":\"default\",\"priority\":0,\"state\":\"running\","
    "\"cancel_requested\":false,\"dependencies\":[],\"on_dependency_failure\":\"cancel\","
    "\"progress\":{\"fraction\":0.4,\"message\":\"step 4 of 10\",\"details\":null,"
    "\"updated_at\":\"2026-11-24T10:00:00.400Z\"},\"attempt\":1,\"max_attempts\":1,\"timeout_ms\":null,"
    "\"retry\":{\"max_attempts\":1,\"backoff_ms\":1000,\"backoff_factor\":2},"
    "\"created_at\":\"2026-11-24T10:00:00.000Z\",\"started_at\":\"2026-11-24T10:00:00.000Z\","
    "\"finished_at\":null,\"result\":null,\"error\":null,\"metadata\":{\"owner\":\"bench\"},"
    "\"workflow\":null}";

static char date_line[64];
static time_t date_second = -1;

static const char *current_date_line(void) {
    time_t now = time(NULL);
    if (now != date_second) {
        struct tm parts;
        gmtime_r(&now, &parts);
        strftime(date_line, sizeof date_line, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &parts);
        date_second = now;
    }
    return date_line;
}

typedef struct {
    uv_tcp_t tcp;
    http_parser parser;
} connection_t;

typedef struct {
    uv_write_t request;
    uv_buf_t buffer;
} write_t;

static uv_loop_t *loop;
static http_parser_settings settings;
static char read_buffer[65536];

static void on_close(uv_handle_t *handle) { free(handle); }

static void on_write(uv_write_t *request, int status) {
    write_t *write = (write_t *)request;
    free(write->buffer.base);
    free(write);
    (void)status;
}

static void send_bytes(connection_t *connection, const char *bytes, size_t length) {
    uv_buf_t buffer = uv_buf_init((char *)bytes, (unsigned)length);
    int sent = uv_try_write((uv_stream_t *)&connection->tcp, &buffer, 1);
    if (sent == (int)length) return;
    if (sent < 0 && sent != UV_EAGAIN) {
        if (!uv_is_closing((uv_handle_t *)&connection->tcp)) uv_close((uv_handle_t *)&connection->tcp, on_close);
        return;
    }
    size_t offset = sent > 0 ? (size_t)sent : 0;
    write_t *write = malloc(sizeof *write);
    write->buffer = uv_buf_init(malloc(length - offset), (unsigned)(length - offset));
    memcpy(write->buffer.base, bytes + offset, length - offset);
    uv_write(&write->request, (uv_stream_t *)&connection->tcp, &write->buffer, 1, on_write);
}

static int on_message_complete(http_parser *parser) {
    connection_t *connection = parser->data;
    int created = parser->method == HTTP_POST;
    int keep_alive = http_should_keep_alive(parser);
    char response[2048];
    int length = snprintf(response, sizeof response,
                          "HTTP/1.1 %s\r\nContent-Type: application/json\r\n%sContent-Length: %zu\r\n%s%s\r\n%s",
                          created ? "201 Created" : "200 OK",
                          created ? "Location: /tasks/01KAT0XB6R7E5V9H2G8M4N3P1Q\r\n" : "",
                          sizeof task_json - 1, current_date_line(), keep_alive ? "" : "Connection: close\r\n",
                          task_json);
    send_bytes(connection, response, (size_t)length);
    if (!keep_alive && !uv_is_closing((uv_handle_t *)&connection->tcp)) {
        uv_close((uv_handle_t *)&connection->tcp, on_close);
    }
    return 0;
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buffer) {
    (void)handle;
    (void)suggested;
    *buffer = uv_buf_init(read_buffer, sizeof read_buffer);
}

static void on_read(uv_stream_t *stream, ssize_t count, const uv_buf_t *buffer) {
    connection_t *connection = (connection_t *)stream;
    if (count < 0) {
        if (!uv_is_closing((uv_handle_t *)stream)) uv_close((uv_handle_t *)stream, on_close);
        return;
    }
    size_t parsed = http_parser_execute(&connection->parser, &settings, buffer->base, (size_t)count);
    if (parsed != (size_t)count && !uv_is_closing((uv_handle_t *)stream)) {
        uv_close((uv_handle_t *)stream, on_close);
    }
}

static void on_connection(uv_stream_t *listener, int status) {
    if (status < 0) return;
    connection_t *connection = malloc(sizeof *connection);
    uv_tcp_init(loop, &connection->tcp);
    if (uv_accept(listener, (uv_stream_t *)&connection->tcp) != 0) {
        uv_close((uv_handle_t *)&connection->tcp, on_close);
        return;
    }
    uv_tcp_nodelay(&connection->tcp, 1);
    http_parser_init(&connection->parser, HTTP_REQUEST);
    connection->parser.data = connection;
    uv_read_start((uv_stream_t *)&connection->tcp, on_alloc, on_read);
}

static void on_signal(uv_signal_t *handle, int signal) {
    (void)signal;
    uv_signal_stop(handle);
    uv_stop(loop);
}

int main(int argc, char **argv) {
    loop = uv_default_loop();
    http_parser_settings_init(&settings);
    settings.on_message_complete = on_message_complete;
    uv_tcp_t listener;
    uv_tcp_init(loop, &listener);
    struct sockaddr_in address;
    uv_ip4_addr("127.0.0.1", argc > 1 ? atoi(argv[1]) : 0, &address);
    if (uv_tcp_bind(&listener, (const struct sockaddr *)&address, 0) != 0 ||
        uv_listen((uv_stream_t *)&listener, 1024, on_connection) != 0) {
        fprintf(stderr, "cannot listen\n");
        return 1;
    }
    struct sockaddr_storage bound;
    int length = sizeof bound;
    uv_tcp_getsockname(&listener, (struct sockaddr *)&bound, &length);
    printf("listening on http://127.0.0.1:%d\n", ntohs(((struct sockaddr_in *)&bound)->sin_port));
    fflush(stdout);
    uv_signal_t stop;
    uv_signal_init(loop, &stop);
    uv_signal_start(&stop, on_signal, SIGTERM);
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}

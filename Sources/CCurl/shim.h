// libcurl's option setters and info getters are C variadic functions, which Swift cannot call.
// These typed wrappers give each argument type one non-variadic entry point; nothing else is
// defined here.
#include <curl/curl.h>

static inline CURLcode taskloop_easy_setopt_long(CURL *easy, CURLoption option, long value) {
    return curl_easy_setopt(easy, option, value);
}

static inline CURLcode taskloop_easy_setopt_pointer(CURL *easy, CURLoption option, const void *value) {
    return curl_easy_setopt(easy, option, value);
}

static inline CURLcode taskloop_easy_setopt_off_t(CURL *easy, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(easy, option, value);
}

static inline CURLcode taskloop_easy_setopt_write_callback(CURL *easy, CURLoption option, curl_write_callback callback) {
    return curl_easy_setopt(easy, option, callback);
}

static inline CURLcode taskloop_easy_setopt_opensocket_callback(CURL *easy, curl_opensocket_callback callback) {
    return curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, callback);
}

static inline CURLcode taskloop_easy_getinfo_long(CURL *easy, CURLINFO info, long *value) {
    return curl_easy_getinfo(easy, info, value);
}

static inline CURLcode taskloop_easy_getinfo_off_t(CURL *easy, CURLINFO info, curl_off_t *value) {
    return curl_easy_getinfo(easy, info, value);
}

static inline CURLcode taskloop_easy_getinfo_pointer(CURL *easy, CURLINFO info, void *value) {
    return curl_easy_getinfo(easy, info, value);
}

static inline CURLMcode taskloop_multi_setopt_pointer(CURLM *multi, CURLMoption option, const void *value) {
    return curl_multi_setopt(multi, option, value);
}

static inline CURLMcode taskloop_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

static inline CURLMcode taskloop_multi_setopt_socket_callback(CURLM *multi, curl_socket_callback callback) {
    return curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, callback);
}

static inline CURLMcode taskloop_multi_setopt_timer_callback(CURLM *multi, curl_multi_timer_callback callback) {
    return curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, callback);
}

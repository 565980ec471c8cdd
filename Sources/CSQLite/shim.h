#include <sqlite3.h>

// SQLITE_TRANSIENT is a cast of -1 to a function pointer, a macro Swift cannot import: it tells
// sqlite3_bind_text/blob to copy the bytes before the call returns.
static inline sqlite3_destructor_type taskloop_sqlite_transient(void) {
    return SQLITE_TRANSIENT;
}

/* The shim's one JSON module (json.c): every JSON text the shim reads goes
 * through the reader, every one it writes through the writer (jb_*).
 *
 * Reader: the messages the shim reads are flat objects (control requests,
 * copy-helper replies, another shim's ipc_fd answer). json_next() walks the
 * members of such an object; a nested object or array is checked and handed
 * over whole (JSON_OBJECT/JSON_ARRAY, as text) for the caller to ignore. The
 * whole text must be one JSON object, whitespace around it allowed: anything
 * else is malformed. Nothing is allocated; the values point into the text. */
#ifndef GPUCR_JSON_H
#define GPUCR_JSON_H

#include <stddef.h>
#include <stdint.h>

enum json_type {
    JSON_STRING = 1,
    JSON_NUMBER,
    JSON_TRUE,
    JSON_FALSE,
    JSON_NULL,
    JSON_OBJECT,
    JSON_ARRAY,
};

struct json_value {
    enum json_type type;
    const char *text; /* as written; a string's without its quotes, escapes undecoded */
    size_t len;
};

struct json_member {
    struct json_value key; /* always JSON_STRING */
    struct json_value value;
};

struct json_reader {
    const char *p;
    int state; /* json.c: where in the object p is */
};

/* Starts reading the object that is all of text (NUL-terminated). */
void json_reader_init(struct json_reader *r, const char *text);
/* The next member into *m: 1; 0 once the object (and the text) ended; -1 when
 * the text is not one JSON object (and on every call after that). */
int json_next(struct json_reader *r, struct json_member *m);

/* A string's value decoded (\" \\ \/ \b \f \n \r \t \uXXXX, as UTF-8) into out,
 * cut to fit cap (NUL-terminated when cap > 0). Returns the decoded length, as
 * snprintf (>= cap: it was cut), or -1: not a string, or it holds \u0000. */
long json_string(const struct json_value *v, char *out, size_t cap);
/* A number's value: 0, or -1 when v is not a number. */
int json_number(const struct json_value *v, double *out);
/* The value of key in the object that is text (the last one, if repeated):
 * 1 found; 0 absent; -1 text is not one JSON object. */
int json_find(const char *text, const char *key, struct json_value *v);

/* ---- writer ------------------------------------------------------------
 * Appends to a buffer that grows (jb_init) or to a fixed one (jb_init_fixed:
 * what does not fit sets overflow, and the text stays NUL-terminated). Output
 * is "key": value pairs separated by ", ", as Python's json.dumps writes them. */
struct jbuf {
    char *buf;
    size_t len, cap;
    int first;    /* next member is the first of its object or array */
    int fixed;    /* buf is the caller's: never reallocated or freed */
    int overflow; /* fixed: something did not fit */
};
void jb_init(struct jbuf *j);
void jb_init_fixed(struct jbuf *j, char *buf, size_t cap);
void jb_free(struct jbuf *j);
void jb_begin(struct jbuf *j);                    /* { */
void jb_end(struct jbuf *j);                      /* } */
void jb_key_obj(struct jbuf *j, const char *key); /* "key": { */
void jb_str(struct jbuf *j, const char *key, const char *val);
void jb_u64(struct jbuf *j, const char *key, uint64_t val);
void jb_i64(struct jbuf *j, const char *key, int64_t val);
void jb_f64(struct jbuf *j, const char *key, double val);
void jb_bool(struct jbuf *j, const char *key, int val);
/* Arrays: "key": [ ... ], elements written with jb_elem_* or nested with jb_arr_begin. */
void jb_key_arr(struct jbuf *j, const char *key); /* "key": [ */
void jb_arr_begin(struct jbuf *j);                /* [ as an element */
void jb_arr_end(struct jbuf *j);                  /* ] */
void jb_elem_str(struct jbuf *j, const char *val);
void jb_elem_u64(struct jbuf *j, uint64_t val);
void jb_elem_i64(struct jbuf *j, int64_t val);
void jb_elem_bool(struct jbuf *j, int val);

#endif

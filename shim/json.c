/* The shim's JSON reader and writer (json.h). Hand-written, no allocation on
 * the reading side; strict JSON (RFC 8259) in, Python-json.dumps-like out. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* ---- reader ------------------------------------------------------------ */

#define MAX_DEPTH 32 /* of a nested value that is skipped */

enum { READ_START, READ_MORE, READ_DONE, READ_BAD };

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *skip_ws(const char *p)
{
    while (is_ws(*p))
        p++;
    return p;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (is_digit(c))
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* The code point of the escape at p (just after the backslash of \u) into *cp;
 * returns the characters read after the backslash, or -1. A surrogate pair is
 * one code point. */
static int unicode_escape(const char *p, unsigned *cp)
{
    unsigned hi, lo;
    if (hex4(p + 1, &hi) != 0)
        return -1;
    if (hi >= 0xDC00 && hi <= 0xDFFF)
        return -1; /* a low surrogate alone */
    if (hi < 0xD800 || hi > 0xDBFF) {
        *cp = hi;
        return 5;
    }
    if (p[5] != '\\' || p[6] != 'u' || hex4(p + 7, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
        return -1;
    *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    return 11;
}

/* A string at p (after its opening quote): returns the closing quote, or NULL. */
static const char *scan_string(const char *p)
{
    for (;;) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p;
        if (c < 0x20)
            return NULL; /* the end of the text, or a raw control character */
        if (c == '\\') {
            unsigned cp;
            p++;
            if (*p == 'u') {
                int n = unicode_escape(p, &cp);
                if (n < 0)
                    return NULL;
                p += n;
                continue;
            }
            if (!strchr("\"\\/bfnrt", *p) || !*p)
                return NULL;
        }
        p++;
    }
}

static const char *scan_digits(const char *p)
{
    if (!is_digit(*p))
        return NULL;
    while (is_digit(*p))
        p++;
    return p;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at p: returns its end, or NULL. */
static const char *scan_number(const char *p)
{
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (!(p = scan_digits(p)))
        return NULL;
    if (*p == '.' && !(p = scan_digits(p + 1)))
        return NULL;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(p = scan_digits(p)))
            return NULL;
    }
    return p;
}

/* One value at p (no leading blanks) into *v; returns its end, or NULL. */
static const char *scan_value(const char *p, struct json_value *v, int depth)
{
    const char *start = p;
    if (*p == '"') {
        const char *end = scan_string(p + 1);
        if (!end)
            return NULL;
        v->type = JSON_STRING;
        v->text = p + 1;
        v->len = (size_t)(end - p - 1);
        return end + 1;
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        struct json_value inner;
        if (depth >= MAX_DEPTH)
            return NULL;
        p = skip_ws(p + 1);
        if (*p != close) {
            for (;;) {
                if (close == '}') {
                    if (*p != '"' || !(p = scan_value(p, &inner, depth + 1)))
                        return NULL;
                    p = skip_ws(p);
                    if (*p != ':')
                        return NULL;
                    p = skip_ws(p + 1);
                }
                if (!(p = scan_value(p, &inner, depth + 1)))
                    return NULL;
                p = skip_ws(p);
                if (*p == close)
                    break;
                if (*p != ',')
                    return NULL;
                p = skip_ws(p + 1);
            }
        }
        v->type = close == '}' ? JSON_OBJECT : JSON_ARRAY;
        v->text = start;
        v->len = (size_t)(p + 1 - start);
        return p + 1;
    }
    if (*p == '-' || is_digit(*p)) {
        if (!(p = scan_number(p)))
            return NULL;
        v->type = JSON_NUMBER;
    } else if (!strncmp(p, "true", 4)) {
        v->type = JSON_TRUE;
        p += 4;
    } else if (!strncmp(p, "false", 5)) {
        v->type = JSON_FALSE;
        p += 5;
    } else if (!strncmp(p, "null", 4)) {
        v->type = JSON_NULL;
        p += 4;
    } else {
        return NULL;
    }
    v->text = start;
    v->len = (size_t)(p - start);
    return p;
}

void json_reader_init(struct json_reader *r, const char *text)
{
    r->p = text ? text : "";
    r->state = READ_START;
}

static int bad(struct json_reader *r)
{
    r->state = READ_BAD;
    return -1;
}

int json_next(struct json_reader *r, struct json_member *m)
{
    const char *p = skip_ws(r->p);
    switch (r->state) {
    case READ_START:
        if (*p != '{')
            return bad(r);
        p = skip_ws(p + 1);
        break;
    case READ_MORE:
        if (*p == ',') {
            p = skip_ws(p + 1);
            if (*p != '"')
                return bad(r); /* no trailing comma */
        } else if (*p != '}')
            return bad(r);
        break;
    case READ_DONE:
        return 0;
    default:
        return -1;
    }
    if (*p == '}') {
        if (*skip_ws(p + 1))
            return bad(r); /* something after the object */
        r->p = p + 1;
        r->state = READ_DONE;
        return 0;
    }
    if (*p != '"' || !(p = scan_value(p, &m->key, 0)))
        return bad(r);
    p = skip_ws(p);
    if (*p != ':')
        return bad(r);
    if (!(p = scan_value(skip_ws(p + 1), &m->value, 0)))
        return bad(r);
    r->p = p;
    r->state = READ_MORE;
    return 1;
}

static void put_utf8(char *out, size_t cap, size_t *n, unsigned cp)
{
    char b[4];
    int k;
    if (cp < 0x80) {
        b[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (char)(0xF0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    for (int i = 0; i < k; i++, (*n)++)
        if (*n + 1 < cap)
            out[*n] = b[i];
}

long json_string(const struct json_value *v, char *out, size_t cap)
{
    if (v->type != JSON_STRING)
        return -1;
    size_t n = 0, cut = 0; /* cut: where out ends, on a whole character */
    for (const char *p = v->text, *end = v->text + v->len; p < end;) {
        char c = *p++;
        if (c != '\\') {
            if (n + 1 < cap)
                out[n] = c;
            n++;
        } else {
            if (p == end)
                return -1; /* not from the reader: a lone backslash at the end */
            c = *p++;
            if (c == 'u') {
                unsigned cp;
                int k = unicode_escape(p - 1, &cp);
                if (k < 0 || cp == 0)
                    return -1;
                p += k - 1;
                put_utf8(out, cap, &n, cp);
            } else {
                c = c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
                if (n + 1 < cap)
                    out[n] = c;
                n++;
            }
        }
        if (n < cap)
            cut = n;
    }
    if (cap)
        out[cut] = 0;
    return (long)n;
}

int json_number(const struct json_value *v, double *out)
{
    char buf[64];
    if (v->type != JSON_NUMBER || v->len >= sizeof buf)
        return -1;
    memcpy(buf, v->text, v->len);
    buf[v->len] = 0;
    *out = strtod(buf, NULL);
    return 0;
}

/* Whether the member's key is key (decoded, compared exactly). */
static int key_is(const struct json_member *m, const char *key)
{
    size_t want = strlen(key);
    if (!memchr(m->key.text, '\\', m->key.len))
        return m->key.len == want && !memcmp(m->key.text, key, want);
    char buf[128];
    long n = json_string(&m->key, buf, sizeof buf);
    return n >= 0 && (size_t)n == want && want < sizeof buf && !memcmp(buf, key, want);
}

int json_find(const char *text, const char *key, struct json_value *v)
{
    struct json_reader r;
    struct json_member m;
    int found = 0, rc;
    json_reader_init(&r, text);
    while ((rc = json_next(&r, &m)) == 1)
        if (key_is(&m, key)) {
            *v = m.value;
            found = 1;
        }
    return rc < 0 ? -1 : found;
}

/* ---- writer ------------------------------------------------------------ */

static void put(struct jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct jbuf *j, const char *fmt, ...)
{
    if (j->overflow)
        return; /* nothing after what did not fit */
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = j->cap - j->len;
        int n = vsnprintf(j->buf ? j->buf + j->len : NULL, j->buf ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if ((size_t)n < room && j->buf) {
            j->len += (size_t)n;
            return;
        }
        if (j->fixed) {
            if (j->buf && j->cap)
                j->buf[j->len] = 0; /* what was there before: no partial item */
            j->overflow = 1;
            return;
        }
        size_t ncap = (j->cap ? j->cap : 256);
        while (ncap <= j->len + (size_t)n)
            ncap *= 2;
        char *nb = realloc(j->buf, ncap);
        if (!nb)
            return;
        j->buf = nb;
        j->cap = ncap;
    }
}

static void sep(struct jbuf *j)
{
    if (!j->first)
        put(j, ", ");
    j->first = 0;
}

static void key(struct jbuf *j, const char *k)
{
    sep(j);
    put(j, "\"%s\": ", k);
}

void jb_init(struct jbuf *j)
{
    memset(j, 0, sizeof *j);
    put(j, "%s", "");
}

void jb_init_fixed(struct jbuf *j, char *buf, size_t cap)
{
    memset(j, 0, sizeof *j);
    j->buf = buf;
    j->cap = cap;
    j->fixed = 1;
    put(j, "%s", "");
}

void jb_free(struct jbuf *j)
{
    if (!j->fixed)
        free(j->buf);
    memset(j, 0, sizeof *j);
}

void jb_begin(struct jbuf *j)
{
    put(j, "{");
    j->first = 1;
}

void jb_end(struct jbuf *j)
{
    put(j, "}");
    j->first = 0;
}

void jb_key_obj(struct jbuf *j, const char *k)
{
    key(j, k);
    jb_begin(j);
}

static void str_value(struct jbuf *j, const char *v)
{
    put(j, "\"");
    for (const char *c = v ? v : ""; *c; c++) {
        if (*c == '"' || *c == '\\')
            put(j, "\\%c", *c);
        else if ((unsigned char)*c < 0x20)
            put(j, "\\u%04x", (unsigned)(unsigned char)*c);
        else
            put(j, "%c", *c);
    }
    put(j, "\"");
}

void jb_str(struct jbuf *j, const char *k, const char *v)
{
    key(j, k);
    str_value(j, v);
}

void jb_u64(struct jbuf *j, const char *k, uint64_t v)
{
    key(j, k);
    put(j, "%" PRIu64, v);
}

void jb_i64(struct jbuf *j, const char *k, int64_t v)
{
    key(j, k);
    put(j, "%" PRId64, v);
}

void jb_f64(struct jbuf *j, const char *k, double v)
{
    key(j, k);
    put(j, "%.6f", v);
}

void jb_bool(struct jbuf *j, const char *k, int v)
{
    key(j, k);
    put(j, "%s", v ? "true" : "false");
}

void jb_key_arr(struct jbuf *j, const char *k)
{
    key(j, k);
    put(j, "[");
    j->first = 1;
}

void jb_arr_begin(struct jbuf *j)
{
    sep(j);
    put(j, "[");
    j->first = 1;
}

void jb_arr_end(struct jbuf *j)
{
    put(j, "]");
    j->first = 0;
}

void jb_elem_str(struct jbuf *j, const char *v)
{
    sep(j);
    str_value(j, v);
}

void jb_elem_u64(struct jbuf *j, uint64_t v)
{
    sep(j);
    put(j, "%" PRIu64, v);
}

void jb_elem_i64(struct jbuf *j, int64_t v)
{
    sep(j);
    put(j, "%" PRId64, v);
}

void jb_elem_bool(struct jbuf *j, int v)
{
    sep(j);
    put(j, "%s", v ? "true" : "false");
}

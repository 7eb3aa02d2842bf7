/* The control protocol: one small JSON object per line each way.
 * Requests are flat objects, e.g. {"cmd": "checkpoint", "timeout_ms": 5000}. */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucr.h"

static const char *skip_ws(const char *p)
{
    while (*p && isspace((unsigned char)*p))
        p++;
    return p;
}

/* Parses a JSON string at p (after the opening quote) into out. */
static const char *parse_string(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            c = *p++;
            if (c == 'n')
                c = '\n';
            else if (c == 't')
                c = '\t';
            else if (c != '"' && c != '\\' && c != '/')
                return NULL; /* \uXXXX and others: not needed by this protocol */
        }
        if (n + 1 < cap)
            out[n++] = c;
        else
            return NULL;
    }
    if (*p != '"')
        return NULL;
    out[n] = 0;
    return p + 1;
}

int gpucr_req_parse(const char *line, struct gpucr_req *req)
{
    memset(req, 0, sizeof *req);
    req->timeout_ms = -1;
    const char *p = skip_ws(line);
    if (*p++ != '{')
        return -1;
    p = skip_ws(p);
    if (*p == '}')
        return -1; /* no cmd */
    for (;;) {
        char key[64], sval[128];
        p = skip_ws(p);
        if (*p++ != '"' || !(p = parse_string(p, key, sizeof key)))
            return -1;
        p = skip_ws(p);
        if (*p++ != ':')
            return -1;
        p = skip_ws(p);
        if (*p == '"') {
            if (!(p = parse_string(p + 1, sval, sizeof sval)))
                return -1;
            if (!strcmp(key, "cmd")) {
                if (strlen(sval) >= sizeof req->cmd)
                    return -1;
                strcpy(req->cmd, sval);
            }
        } else if (*p == '-' || isdigit((unsigned char)*p)) {
            char *end;
            double v = strtod(p, &end);
            if (end == p)
                return -1;
            p = end;
            if (!strcmp(key, "timeout_ms"))
                req->timeout_ms = (long)v;
            else if (!strcmp(key, "id") && v >= 0)
                req->id = (uint64_t)v;
        } else if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4)) {
            p += 4;
        } else if (!strncmp(p, "false", 5)) {
            p += 5;
        } else {
            return -1;
        }
        p = skip_ws(p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p != '}')
            return -1;
        p = skip_ws(p + 1);
        return (*p == 0 && req->cmd[0]) ? 0 : -1;
    }
}

/* ---- writer ------------------------------------------------------------ */

static void put(struct jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct jbuf *j, const char *fmt, ...)
{
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

static void key(struct jbuf *j, const char *k)
{
    if (!j->first)
        put(j, ", ");
    j->first = 0;
    put(j, "\"%s\": ", k);
}

void jb_init(struct jbuf *j)
{
    memset(j, 0, sizeof *j);
    put(j, "%s", "");
}

void jb_free(struct jbuf *j)
{
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

void jb_str(struct jbuf *j, const char *k, const char *v)
{
    key(j, k);
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

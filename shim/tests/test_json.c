/* json.c: the reader on the messages the shim reads, and the writer's arrays
 * and fixed buffers on the messages it sends the copy helper. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "json.h"

/* The members of text as "key=type" words, or "BAD" once it turns out malformed. */
static const char *walk(const char *text)
{
    static char out[512];
    struct json_reader r;
    struct json_member m;
    int rc;
    size_t at = 0;
    out[0] = 0;
    json_reader_init(&r, text);
    while ((rc = json_next(&r, &m)) == 1) {
        char key[64];
        json_string(&m.key, key, sizeof key);
        at += (size_t)snprintf(out + at, sizeof out - at, "%s%s=%d", at ? " " : "", key, (int)m.value.type);
    }
    if (rc < 0)
        snprintf(out, sizeof out, "BAD");
    CHECK(json_next(&r, &m) == rc); /* it stays ended, or bad */
    return out;
}

static int find_bool(const char *text, const char *key)
{
    struct json_value v;
    int rc = json_find(text, key, &v);
    if (rc != 1)
        return rc < 0 ? -1 : -2;
    return v.type == JSON_TRUE ? 1 : v.type == JSON_FALSE ? 0 : -3;
}

static double find_num(const char *text, const char *key)
{
    struct json_value v;
    double d = NAN;
    if (json_find(text, key, &v) == 1)
        json_number(&v, &d);
    return d;
}

static const char *find_str(const char *text, const char *key)
{
    static char out[128];
    struct json_value v;
    if (json_find(text, key, &v) != 1 || json_string(&v, out, sizeof out) < 0)
        return "(none)";
    return out;
}

int main(void)
{
    /* ok true / false, as the copy helper (Python's json.dumps) and the shim write it */
    CHECK(find_bool("{\"ok\": true, \"seconds\": 0.25}", "ok") == 1);
    CHECK(find_bool("{\"ok\":false,\"error\":\"no\"}", "ok") == 0);
    CHECK(find_bool(" {\"ok\" : true }\n", "ok") == 1);
    CHECK(find_bool("{\"error\": \"\\\"ok\\\": true\"}", "ok") == -2);  /* only a string that says so */
    CHECK(find_bool("{\"x\": {\"ok\": true}}", "ok") == -2);            /* nested: not the reply's */
    CHECK(find_bool("{\"ok\": \"true\"}", "ok") == -3);
    CHECK(find_bool("{\"ok\": 1}", "ok") == -3);
    CHECK(find_bool("{\"ok\": false, \"ok\": true}", "ok") == 1);       /* the last one, as Python */
    CHECK(find_bool("{\"ok\": true", "ok") == -1);                      /* cut short */
    CHECK(find_bool("{\"ok\": tru}", "ok") == -1);
    PASS("json ok true/false");

    /* numbers */
    CHECK(find_num("{\"a\": 0}", "a") == 0);
    CHECK(find_num("{\"a\": -12}", "a") == -12);
    CHECK(find_num("{\"a\": 0.125}", "a") == 0.125);
    CHECK(find_num("{\"a\": 1.5e-05}", "a") == 1.5e-05); /* Python writes small floats so */
    CHECK(find_num("{\"a\": 2E+3}", "a") == 2000);
    CHECK(find_num("{\"a\": 18446744073709551615}", "a") == 18446744073709551615.0);
    CHECK(!strcmp(walk("{\"a\": 01}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": 1.}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": .5}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": +1}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": 0x10}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": 1e}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": -}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": NaN}"), "BAD"));
    struct json_value sv = {JSON_STRING, "1", 1};
    double d;
    CHECK(json_number(&sv, &d) == -1);
    PASS("json numbers");

    /* nested values are checked and handed over whole, for the caller to ignore */
    CHECK(!strcmp(walk("{\"a\": [1, [2, {\"b\": null}], \"]\"], \"o\": {\"k\": {}}, \"z\": []}"), "a=7 o=6 z=7"));
    CHECK(find_num("{\"steps\": {\"map_s\": 9}, \"map_s\": 0.5}", "map_s") == 0.5);
    struct json_value v;
    CHECK(json_find("{\"o\": {\"x\": [1, 2]} , \"n\": 1}", "o", &v) == 1 && v.type == JSON_OBJECT);
    CHECK(v.len == strlen("{\"x\": [1, 2]}") && !strncmp(v.text, "{\"x\": [1, 2]}", v.len));
    CHECK(!strcmp(walk("{\"a\": [1, 2,]}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": [1 2]}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": {\"b\" 1}}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": {1: 2}}"), "BAD"));
    CHECK(!strcmp(walk("{\"a\": [}"), "BAD"));
    char deep[200];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "{\"a\": ");
    for (int i = 0; i < 40; i++)
        strcat(deep, "[");
    for (int i = 0; i < 40; i++)
        strcat(deep, "]");
    strcat(deep, "}");
    CHECK(!strcmp(walk(deep), "BAD")); /* deeper than any message: refused, not recursed into */
    PASS("json nested values ignored");

    /* strings and their escapes */
    CHECK(!strcmp(find_str("{\"s\": \"plain\"}", "s"), "plain"));
    CHECK(!strcmp(find_str("{\"s\": \"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t\"}", "s"), "q\" b\\ s/ \b\f\n\r\t"));
    CHECK(!strcmp(find_str("{\"s\": \"\\u0041\\u00e9\\u20ac\\ud83d\\ude00\"}", "s"),
                  "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
    CHECK(!strcmp(find_str("{\"s\": \"\\u000a\"}", "s"), "\n")); /* as jb_str writes control characters */
    CHECK(!strcmp(find_str("{\"k\\u0065y\": \"v\"}", "key"), "v")); /* keys are decoded too */
    CHECK(!strcmp(find_str("{\"s\": \"\\u0000\"}", "s"), "(none)"));
    CHECK(!strcmp(walk("{\"s\": \"\\x\"}"), "BAD"));
    CHECK(!strcmp(walk("{\"s\": \"\\u12\"}"), "BAD"));
    CHECK(!strcmp(walk("{\"s\": \"\\ud83d\"}"), "BAD"));  /* a high surrogate alone */
    CHECK(!strcmp(walk("{\"s\": \"\\ude00\"}"), "BAD"));  /* a low one alone */
    CHECK(!strcmp(walk("{\"s\": \"a\tb\"}"), "BAD"));     /* a raw control character */
    CHECK(!strcmp(walk("{\"s\": \"open}"), "BAD"));
    CHECK(!strcmp(walk("{\"s\": \"ends in \\"), "BAD"));
    /* cut to fit, never inside a UTF-8 character; the length says it was cut */
    char small[6];
    struct json_value s8 = {JSON_STRING, "abcd\\u20ac", 10};
    CHECK(json_string(&s8, small, sizeof small) == 7 && !strcmp(small, "abcd"));
    struct json_value s4 = {JSON_STRING, "abcdefgh", 8};
    CHECK(json_string(&s4, small, sizeof small) == 8 && !strcmp(small, "abcde"));
    CHECK(json_string(&s4, NULL, 0) == 8);
    struct json_value lone = {JSON_STRING, "ab\\", 3};
    CHECK(json_string(&lone, small, sizeof small) == -1);
    PASS("json strings");

    /* malformed: not one object */
    const char *bad[] = {"",
                         "   ",
                         "null",
                         "[]",
                         "\"ok\"",
                         "{",
                         "}",
                         "{\"a\"}",
                         "{\"a\" 1}",
                         "{\"a\": }",
                         "{\"a\": 1,}",
                         "{,}",
                         "{\"a\": 1 \"b\": 2}",
                         "{\"a\": 1} {}",
                         "{\"a\": 1} x",
                         "{a: 1}",
                         "{'a': 1}",
                         "{\"a\": True}",
                         "{\"a\": nul}",
                         "{\"a\": 1}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (strcmp(walk(bad[i]), "BAD") != 0) {
            fprintf(stderr, "accepted: %s\n", bad[i]);
            CHECK(0);
        }
        CHECK(json_find(bad[i], "a", &v) == -1);
    }
    CHECK(!strcmp(walk("{}"), ""));
    CHECK(!strcmp(walk(" \t\r\n{ } \n"), ""));
    CHECK(!strcmp(walk("{\"t\": true, \"f\": false, \"n\": null, \"s\": \"\", \"x\": -0.0}"), "t=3 f=4 n=5 s=1 x=2"));
    PASS("json malformed input");

    /* the writer: arrays, and a fixed buffer as the copy helper's messages use */
    char buf[256];
    struct jbuf j;
    jb_init_fixed(&j, buf, sizeof buf);
    jb_begin(&j);
    jb_str(&j, "cmd", "out");
    jb_key_arr(&j, "blobs");
    for (int i = 0; i < 2; i++) {
        jb_arr_begin(&j);
        jb_elem_u64(&j, 18446744073709551615ULL - (uint64_t)i);
        jb_elem_u64(&j, 2097152);
        jb_elem_i64(&j, -1 + i);
        jb_elem_u64(&j, 0);
        jb_elem_str(&j, "0a1b");
        jb_elem_i64(&j, i);
        jb_arr_end(&j);
    }
    jb_arr_end(&j);
    jb_key_arr(&j, "empty");
    jb_arr_end(&j);
    jb_bool(&j, "keep", 0);
    jb_end(&j);
    /* the bytes the shim sent before json.c: snprintf("[%llu, %zu, %d, %zu, \"%s\", %d]") */
    CHECK(!j.overflow &&
          !strcmp(buf, "{\"cmd\": \"out\", \"blobs\": [[18446744073709551615, 2097152, -1, 0, \"0a1b\", 0], "
                       "[18446744073709551614, 2097152, 0, 0, \"0a1b\", 1]], \"empty\": [], \"keep\": false}"));
    CHECK(j.len == strlen(buf));
    jb_free(&j); /* the caller's buffer: not freed */
    CHECK(!strcmp(walk(buf), "cmd=1 blobs=7 empty=7 keep=4"));
    char tiny[24];
    jb_init_fixed(&j, tiny, sizeof tiny);
    jb_begin(&j);
    jb_str(&j, "cmd", "in_done");
    CHECK(!j.overflow);
    jb_bool(&j, "keep", 1);
    jb_end(&j);
    CHECK(j.overflow && !strcmp(tiny, "{\"cmd\": \"in_done\", ")); /* nothing after what did not fit */
    jb_init_fixed(&j, buf, sizeof buf);
    jb_begin(&j);
    jb_key_arr(&j, "segment_linkable");
    jb_elem_bool(&j, 1);
    jb_elem_bool(&j, 0);
    jb_arr_end(&j);
    jb_end(&j);
    CHECK(!j.overflow && !strcmp(buf, "{\"segment_linkable\": [true, false]}"));
    PASS("json writer arrays and fixed buffers");
    return 0;
}

/* Request parsing and the JSON writer, plus dispatch of unknown/bad requests. */
#include <string.h>

#include "check.h"
#include "dispatch.h"
#include "json.h"
#include "protocol.h"

int main(void)
{
    struct gpucr_req r;
    CHECK(gpucr_req_parse("{\"cmd\": \"status\"}", &r) == 0 && !strcmp(r.cmd, "status") && r.timeout_ms == -1);
    CHECK(gpucr_req_parse(" {\"timeout_ms\":2500, \"cmd\":\"checkpoint\", \"x\": true} ", &r) == 0);
    CHECK(!strcmp(r.cmd, "checkpoint") && r.timeout_ms == 2500 && r.id == 0);
    CHECK(gpucr_req_parse("{\"cmd\":\"ipc_fd\",\"id\":42}", &r) == 0 && r.id == 42);
    CHECK(gpucr_req_parse("{\"cmd\":\"a\\\"b\"}", &r) == 0 && !strcmp(r.cmd, "a\"b"));
    CHECK(gpucr_req_parse("", &r) == -1);
    CHECK(gpucr_req_parse("{}", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":}", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"status\"", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"status\"} trailing", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", &r) == -1);
    CHECK(gpucr_req_parse("{\"timeout_ms\": 5}", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"status\",\"x\":[1]}", &r) == -1); /* requests are flat */
    CHECK(gpucr_req_parse("{\"cmd\":\"status\",\"x\":{}}", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"status\",}", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":5}", &r) == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"status\",\"timeout_ms\":\"5\"}", &r) == 0 && r.timeout_ms == -1);
    CHECK(gpucr_req_parse("{\"cmd\":\"ipc_fd\",\"id\":-4}", &r) == 0 && r.id == 0);
    /* a long string beside cmd is the command's to read (nccl_rebuild's unique ids) */
    CHECK(gpucr_req_parse("{\"cmd\":\"status\",\"pad\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", &r) == 0 &&
          !strcmp(r.cmd, "status"));
    PASS("parse");

    struct jbuf j;
    jb_init(&j);
    jb_begin(&j);
    jb_bool(&j, "ok", 1);
    jb_str(&j, "s", "q\"\\\n");
    jb_u64(&j, "u", 18446744073709551615ULL);
    jb_i64(&j, "i", -3);
    jb_f64(&j, "f", 0.5);
    jb_key_obj(&j, "o");
    jb_u64(&j, "a", 1);
    jb_end(&j);
    jb_end(&j);
    CHECK(!strcmp(j.buf, "{\"ok\": true, \"s\": \"q\\\"\\\\\\u000a\", \"u\": 18446744073709551615, "
                         "\"i\": -3, \"f\": 0.500000, \"o\": {\"a\": 1}}"));
    jb_free(&j);
    /* long output grows the buffer */
    jb_init(&j);
    jb_begin(&j);
    char key[16];
    for (int i = 0; i < 500; i++) {
        snprintf(key, sizeof key, "k%d", i);
        jb_u64(&j, key, (uint64_t)i);
    }
    jb_end(&j);
    struct json_value v;
    double d;
    CHECK(j.len > 4000 && json_find(j.buf, "k499", &v) == 1 && json_number(&v, &d) == 0 && d == 499);
    jb_free(&j);
    PASS("writer");

    char err[128];
    jb_init(&j);
    gpucr_dispatch("{\"cmd\":\"nope\"}", &j);
    CHECK(json_find(j.buf, "error", &v) == 1 && json_string(&v, err, sizeof err) > 0 && !strcmp(err, "unknown command"));
    j.len = 0;
    gpucr_dispatch("garbage", &j);
    CHECK(json_find(j.buf, "error", &v) == 1 && json_string(&v, err, sizeof err) > 0 && !strncmp(err, "bad request", 11));
    j.len = 0;
    gpucr_dispatch("{\"cmd\":\"ping\"}", &j);
    CHECK(json_find(j.buf, "ok", &v) == 1 && v.type == JSON_TRUE);
    j.len = 0;
    gpucr_dispatch("{\"cmd\":\"ipc_fd\",\"id\":7}", &j); /* the stub has no exports */
    CHECK(json_find(j.buf, "ok", &v) == 1 && v.type == JSON_FALSE);
    CHECK(json_find(j.buf, "error", &v) == 1 && json_string(&v, err, sizeof err) > 0 && !strncmp(err, "no such IPC export", 18));
    j.len = 0;
    gpucr_dispatch("{\"cmd\":\"arena_files\"}", &j); /* a command (the stub's answer) */
    CHECK(json_find(j.buf, "ok", &v) == 1 && v.type == JSON_TRUE && json_find(j.buf, "error", &v) == 0);
    jb_free(&j);
    PASS("dispatch");
    return 0;
}

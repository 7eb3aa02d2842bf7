/* The control requests, read with json.c (protocol.h). */
#include <string.h>

#include "json.h"
#include "protocol.h"
#include "protocol_keys.h"

int gpucr_req_parse(const char *line, struct gpucr_req *req)
{
    struct json_reader r;
    struct json_member m;
    int rc;
    memset(req, 0, sizeof *req);
    req->timeout_ms = -1;
    json_reader_init(&r, line);
    while ((rc = json_next(&r, &m)) == 1) {
        char key[64], sval[128];
        double v;
        long n = json_string(&m.key, key, sizeof key);
        if (n < 0 || (size_t)n >= sizeof key)
            return -1;
        switch (m.value.type) {
        case JSON_STRING:
            if (strcmp(key, KEY_cmd))
                break; /* other strings are read by the command itself */
            n = json_string(&m.value, sval, sizeof sval);
            if (n < 0 || (size_t)n >= sizeof sval || (size_t)n >= sizeof req->cmd)
                return -1;
            strcpy(req->cmd, sval);
            break;
        case JSON_NUMBER:
            json_number(&m.value, &v);
            if (!strcmp(key, KEY_timeout_ms))
                req->timeout_ms = (long)v;
            else if (!strcmp(key, KEY_id) && v >= 0)
                req->id = (uint64_t)v;
            break;
        case JSON_TRUE:
            if (!strcmp(key, KEY_linkable))
                req->linkable = 1;
            break;
        case JSON_FALSE:
        case JSON_NULL:
            break;
        default:
            return -1; /* requests are flat */
        }
    }
    return rc == 0 && req->cmd[0] ? 0 : -1;
}

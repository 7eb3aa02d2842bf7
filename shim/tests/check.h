/* Minimal assertions for the shim's C unit tests: print and exit non-zero. */
#ifndef GPUCR_CHECK_H
#define GPUCR_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define PASS(name) printf("ok %s\n", name)
#endif

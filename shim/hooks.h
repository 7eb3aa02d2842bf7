/* The hooks of the driver's entry points, and how driver.c finds them: between
 * driver.c, hooks_getproc.c and the generated hooks_registry.c. */
#ifndef GPUCR_HOOKS_H
#define GPUCR_HOOKS_H

#include "driver.h"
#include "gate.h"

/* One intercepted entry point: its exported name, our hook, the real one. */
struct gpucr_hook {
    const char *name;
    void *hook;
    void **real;
};

/* Every hooked entry point, ended by {0}: hooks_registry.c, generated from
 * cuda.h by tools/gen_hooks.py (make gen; make check-generated). */
extern const struct gpucr_hook gpucr_hooks[];

void *gpucr_hook_for_real(void *real); /* our hook for a real entry point, or NULL */

/* Pass-through of a work-submission call inside the API gate. */
#define GPUCR_GATED_CALL(name, args)                                     \
    do {                                                                 \
        if (!real_##name && (gpucr_driver_load() || !real_##name))       \
            return CUDA_ERROR_NOT_INITIALIZED;                           \
        gpucr_gate_enter();                                              \
        CUresult r_ = ((__typeof__(&name))real_##name) args;             \
        gpucr_gate_exit();                                               \
        return r_;                                                       \
    } while (0)

#endif

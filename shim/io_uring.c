/* No io_uring for programs under gpucr: CRIU cannot checkpoint an io_uring
 * instance, and libuv (PyTorch's TCP store, torchrun's rendezvous) opens one as
 * soon as its loop starts. libuv, like most users, asks through libc's
 * syscall(); told ENOSYS, as by a kernel without io_uring, it uses epoll, which
 * CRIU dumps. GPUCR_IO_URING=1 lets a program have it (and not be checkpointed). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

#include "export.h"

typedef long (*syscall_fn)(long, ...);

static int io_uring_allowed(void)
{
    const char *v = getenv("GPUCR_IO_URING");
    return v && (!strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true"));
}

GPUCR_EXPORT long syscall(long number, ...)
{
    static syscall_fn real;
    va_list ap;
    long a[6];

    va_start(ap, number);
    for (int i = 0; i < 6; i++) /* the kernel takes at most six; extra ones are not read */
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_io_uring_setup && !io_uring_allowed()) {
        errno = ENOSYS;
        return -1;
    }
    if (!real)
        real = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
    return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

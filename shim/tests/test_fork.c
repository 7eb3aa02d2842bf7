/* Fork handling of the core: a child starts with an open gate, an empty table
 * and an arena of its own, while the parent's state is untouched. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "arena.h"
#include "gate.h"
#include "table.h"

int main(void)
{
    char dir[] = "/tmp/gpucr-fork-test-XXXXXX";
    CHECK(mkdtemp(dir) && gpucr_arena_configure(dir) == 0);
    size_t sz = 1 << 20;
    void *blob;
    CHECK(gpucr_arena_place(&sz, 1, &blob, NULL, NULL) == 0);
    memset(blob, 'P', sz);
    gpucr_table_lock();
    CHECK(gpucr_phys_add(0x1234, 2 << 20));
    gpucr_table_unlock();
    CHECK(gpucr_gate_close(100) == 0);

    pid_t pid = fork();
    if (pid == 0) {
        gpucr_gate_after_fork_child();
        gpucr_table_after_fork_child();
        gpucr_arena_after_fork_child();
        CHECK(!gpucr_gate_is_closed());
        gpucr_gate_enter(); /* must not block */
        gpucr_gate_exit();
        gpucr_table_lock(); /* the lock is usable */
        CHECK(gpucr_phys_count() == 0 && !gpucr_phys_get(0x1234));
        gpucr_table_unlock();
        CHECK(gpucr_arena_capacity() == 0);
        void *mine;
        CHECK(gpucr_arena_place(&sz, 1, &mine, NULL, NULL) == 0);
        memset(mine, 'C', sz); /* its own segment: the parent's data stays */
        gpucr_arena_destroy(NULL);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(gpucr_gate_is_closed());
    gpucr_gate_open();
    CHECK(((char *)blob)[0] == 'P' && ((char *)blob)[sz - 1] == 'P');
    CHECK(gpucr_phys_get(0x1234) != NULL);
    gpucr_arena_destroy(NULL);
    rmdir(dir);
    PASS("fork");
    return 0;
}

/* How one copy of allocation contents went, as each way of copying reports it
 * (datapath.c, helper.c) and the replies tell it (checkpoint.c). */
#ifndef GPUCR_COPY_STATS_H
#define GPUCR_COPY_STATS_H

struct gpucr_copy_stats {
    double seconds; /* the copy itself */
    double setup_s; /* one-time staging setup paid by this copy */
    int bounce, threads;
    int streaming; /* ring <-> arena with non-temporal stores (GPUCR_COPY_NT) */
    int blocking;  /* workers sleep on the DMA events (GPUCR_COPY_WAIT) */
    /* the copy helper's steps as it timed them ("import_s", "wait_s", ...),
     * summed over its answers: where a helped copy's time went */
    int nsteps;
    struct {
        char name[32];
        double s;
    } steps[16];
};

#endif

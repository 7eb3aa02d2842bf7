/* The part of NCCL's API the shim sees: our own declarations of the types in
 * NCCL's entry points, so that the shim builds without NCCL's headers (the
 * library comes with the framework's wheel; its header often does not).
 * Enumerations are passed as int; every handle is an opaque pointer. */
#ifndef GPUCR_NCCL_API_H
#define GPUCR_NCCL_API_H

#include <stddef.h>
#include <stdint.h>

typedef int ncclResult_t; /* ncclSuccess = 0 */
#define GPUCR_NCCL_SUCCESS 0
#define GPUCR_NCCL_INVALID_ARGUMENT 4
#define GPUCR_NCCL_INVALID_USAGE 5
#define GPUCR_NCCL_IN_PROGRESS 7
#define GPUCR_NCCL_SPLIT_NOCOLOR (-1)

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef struct CUstream_st *cudaStream_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef int ncclScalarResidence_t;
typedef int ncclCommMemStat_t;
typedef struct gpucr_nccl_opaque ncclWaitSignalDesc_t;
typedef struct gpucr_nccl_opaque ncclCommProperties_t;
typedef struct gpucr_nccl_opaque ncclDevCommRequirements_t;
typedef struct gpucr_nccl_opaque ncclDevComm_t;

#define GPUCR_NCCL_ID_BYTES 128
typedef struct {
    char internal[GPUCR_NCCL_ID_BYTES];
} ncclUniqueId;

/* ncclConfig_t grows with NCCL's versions; every version starts with its own
 * size, and `blocking` comes after size, magic and version. */
typedef struct ncclConfig_head {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
} ncclConfig_t;

#endif

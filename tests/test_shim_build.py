"""The shim builds, its C unit tests pass, it exports the hooks, and loading it
into programs that do not use CUDA changes nothing."""

import subprocess
import sys
import textwrap

import pytest
from shim_helpers import CUDA_HOME, SHIM, SHIM_DIR, build_shim, shim_env


def test_c_unit_tests():
    r = subprocess.run(["make", "-s", "-C", str(SHIM_DIR), "test"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("gate blocks new calls while closed", "gate close timeout reopens", "phys/map",
                 "arena reuse", "arena growth", "parse", "dispatch", "fork",
                 "json ok true/false", "json numbers", "json nested values ignored", "json strings",
                 "json malformed input", "json writer arrays and fixed buffers"):
        assert f"ok {name}" in r.stdout


def test_generated_hook_registry_is_current():
    """hooks_registry.c is what tools/gen_hooks.py makes of this machine's cuda.h."""
    cuda_h = CUDA_HOME / "include" / "cuda.h"
    if not cuda_h.is_file():
        pytest.skip(f"no cuda.h in {CUDA_HOME}/include: make check-generated cannot compare")
    r = subprocess.run(["make", "-s", "-C", str(SHIM_DIR), f"CUDA_HOME={CUDA_HOME}", "check-generated"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    version = next(ln.split()[2] for ln in cuda_h.read_text().splitlines() if ln.startswith("#define CUDA_VERSION "))
    assert f"(CUDA_VERSION {version})" in (SHIM_DIR / "hooks_registry.c").read_text().splitlines()[0]


def test_check_generated_without_cuda_headers_is_one_skip_line():
    r = subprocess.run(["make", "-s", "-C", str(SHIM_DIR), "CUDA_HOME=/nonexistent/cuda", "check-generated"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["check-generated: skipped: no cuda.h in /nonexistent/cuda/include",
                                     "check-generated: skipped: no cuda.h in /nonexistent/cuda/include",
                                     "check-generated: skipped: no nccl.h in /nonexistent/cuda/include"]
    assert r.stderr == ""


NCCL_H = """
#define NCCL_VERSION_CODE 22809
typedef struct ncclComm* ncclComm_t;
/* an operation: counted, parks at a cut */
ncclResult_t  ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t  ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t  ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
ncclResult_t  ncclCommDestroy(ncclComm_t comm);
ncclResult_t  ncclGetVersion(int *version);
"""


def test_nccl_hooks_are_generated_for_every_entry_point_that_takes_a_communicator(tmp_path):
    """tools/gen_nccl_hooks.py: operations counted, windows marked, hand-written and
    communicator-free ones left out; the output builds against the shim's headers."""
    header = tmp_path / "nccl.h"
    header.write_text(NCCL_H)
    r = subprocess.run([sys.executable, str(SHIM_DIR / "tools" / "gen_nccl_hooks.py"), str(header)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    code = r.stdout
    assert "(NCCL_VERSION_CODE 22809)" in code.splitlines()[0]
    assert 'gpucr_nccl_enter(&c, comm, GPUCR_NCCL_OPERATION, &real, "pncclAllReduce", stream)' in code
    assert 'GPUCR_NCCL_PLAIN, &real, "pncclCommMemStats", NULL)' in code
    assert 'GPUCR_NCCL_UNRESTORABLE, &real, "pncclCommWindowRegister", NULL)' in code
    assert "ncclCommDestroy" not in code and "ncclGetVersion" not in code and " pncclAllReduce(" not in code
    src = tmp_path / "hooks.c"
    src.write_text(code)
    r = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{SHIM_DIR}", str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_missing_cuda_headers_fail_with_one_line():
    r = subprocess.run(["make", "-s", "-C", str(SHIM_DIR), "CUDA_HOME=/nonexistent/cuda", "libgpucr-cuda.so"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if "cuda.h" in ln]
    assert len(lines) == 1 and "/nonexistent/cuda/include" in lines[0]


def test_not_linked_against_libcuda_and_exports_hooks():
    lib = build_shim()
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libcuda" not in needed
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout.split()
    for name in ("dlsym", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuMemFree_v2",
                 "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemSetAccess",
                 "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocAsync_ptsz", "cuLaunchKernel",
                 "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuGraphLaunch", "cuLaunchHostFunc",
                 "cuMemcpyHtoD_v2", "cuMemcpyAsync_ptsz", "cuMemsetD8Async", "cuMemAllocManaged",
                 "cuIpcGetMemHandle", "cuMemExportToShareableHandle"):
        assert name in syms, name
    # internal helpers stay hidden
    assert "gpucr_gate_enter" not in syms


def test_harmless_in_cpu_programs(tmp_path):
    env = shim_env(tmp_path / "run")
    script = ("import os, subprocess; "
              "print(subprocess.run(['sh', '-c', 'echo $((6*7))'], capture_output=True, text=True).stdout.strip()); "
              "print('libcuda' in open('/proc/self/maps').read())")
    plain = subprocess.run(["python3", "-c", script], capture_output=True, text=True)
    shimmed = subprocess.run(["python3", "-c", script], capture_output=True, text=True, env=env)
    assert shimmed.returncode == 0, shimmed.stderr
    assert shimmed.stdout == plain.stdout == "42\nFalse\n"
    assert shimmed.stderr == ""


def test_a_multicast_object_is_counted_so_that_a_checkpoint_refuses_it(tmp_path):
    """NVLink multicast (NCCL's NVLS) cannot be made again at a restore: the shim
    counts cuMulticastCreate calls (passed on to the driver unchanged; here there is
    none) and reports them, and a checkpoint or a cut then refuses the process."""
    run = tmp_path / "run"
    code = ("import ctypes, json, os, socket; lib = ctypes.CDLL(None); "
            "print(lib.cuMulticastCreate(None, None)); "
            "s = socket.socket(socket.AF_UNIX); s.connect(os.path.join(os.environ['GPUCR_RUN_DIR'], "
            "f'{os.getpid()}.sock')); s.sendall(b'{\"cmd\": \"status\"}\\n'); "
            "print(json.loads(s.makefile().readline())['multicast_objects'])")
    r = subprocess.run(["python3", "-c", code], capture_output=True, text=True, env=shim_env(run), timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "1"]  # CUDA_ERROR_NOT_INITIALIZED: no driver here; counted all the same


def test_dlsym_rtld_next_of_other_libraries_still_right(tmp_path):
    """A second preloaded library that wraps getpid with dlsym(RTLD_NEXT) must get
    libc's getpid, not its own (which would recurse forever)."""
    build_shim()
    src = tmp_path / "wrap.c"
    src.write_text(textwrap.dedent("""
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <unistd.h>
        pid_t getpid(void) {
            pid_t (*next)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
            return next() + 1000000;
        }
    """))
    wrap = tmp_path / "libwrap.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(wrap), str(src), "-ldl"], check=True)
    env = shim_env(tmp_path / "run", GPUCR_CONTROL=0)
    env["LD_PRELOAD"] = f"{SHIM} {wrap}"
    r = subprocess.run(["python3", "-c", "import os, ctypes; print(ctypes.CDLL(None).getpid() - os.getppid() > 0)"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    out = subprocess.run(["python3", "-c", "import ctypes; print(ctypes.CDLL(None).getpid())"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0 and int(out.stdout) > 1000000


def test_driver_calls_without_a_driver_fail_cleanly(tmp_path):
    """With no libcuda on the machine, a hooked entry point returns an error
    (CUDA_ERROR_NOT_INITIALIZED = 3) instead of crashing."""
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 is installed here")
    except OSError:
        pass
    env = shim_env(tmp_path / "run")
    code = ("import ctypes; lib = ctypes.CDLL(None); p = ctypes.c_uint64(); "
            "print(lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20)), "
            "lib.cuLaunchKernel_ptsz(*([None] * 11)))")
    r = subprocess.run(["python3", "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "3"]

// gpu.c: the start-up check of a replica's GPU (see gpu.h).
//
// Order matters: the NVML process list is read before this process creates its own CUDA context
// (in a container NVML reports host pids, so this process could not be told from another one).
#include "gpu.h"

#include <stdio.h>

#ifdef CALLA_CUDA
#include "nvml.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

static const char *hint(void) {
    return "choose another GPU with --device (or CUDA_VISIBLE_DEVICES), or stop what runs there (nvidia-smi shows it)";
}

int gpu_check_free(int device, int64_t need_bytes, bool exclusive, char *err, size_t errlen) {
    char bus[32] = "";
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) bus[0] = 0;
    cudaGetLastError();
    if (exclusive && bus[0]) {
        long long pid = -1, mem = -1;
        int n = nvml_other_processes(bus, (long long)getpid(), &pid, &mem);
        if (n > 0) {
            snprintf(err, errlen,
                     "GPU %d (%s) is busy: %d other process%s compute%s on it (pid %lld, %.1f GiB); "
                     "one replica per GPU: %s",
                     device, bus, n, n == 1 ? "" : "es", n == 1 ? "s" : "", pid,
                     mem >= 0 ? (double)mem / (1 << 30) : 0.0, hint());
            return -1;
        }
    }
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaFree(0); // creates the context: refused when an exclusive-process GPU is taken
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (e == cudaErrorDevicesUnavailable)
            snprintf(err, errlen,
                     "GPU %d (%s) is busy: it is in exclusive-process mode and another process holds it; %s", device,
                     bus, hint());
        else
            snprintf(err, errlen, "cannot use GPU %d (%s): %s", device, bus, cudaGetErrorString(e));
        return -1;
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && (int64_t)free_b < need_bytes) {
        snprintf(err, errlen,
                 "GPU %d (%s) is busy or too small: %.1f GiB free of %.1f GiB, and the weights alone need "
                 "%.1f GiB; %s",
                 device, bus, (double)free_b / (1 << 30), (double)total_b / (1 << 30), (double)need_bytes / (1 << 30),
                 hint());
        return -1;
    }
    cudaGetLastError();
    return 0;
}

#else

int gpu_check_free(int device, int64_t need_bytes, bool exclusive, char *err, size_t errlen) {
    return 0;
}

#endif

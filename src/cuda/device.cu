// device.cu: what the device runs of this binary. The fast mode's attention and products use sm_90a's
// warpgroup products (wgmma, setmaxnreg); the binary holds sm_90 code too, and the driver picks.
#include "common.cuh"

static __global__ void sm90a_probe(int *ok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *ok = 1;
#else
    *ok = 0;
#endif
}

// Whether the code the device runs was compiled with the sm_90a features (wgmma): a probe kernel
// reports it, once (the binary may hold sm_90 code too, and the driver picks).
extern "C" int k_has_sm90a(void) {
    static int known = -1;
    if (known < 0) {
        int *d = NULL, h = 0;
        if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return 0;
        sm90a_probe<<<1, 1>>>(d);
        const cudaError_t e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
        cudaFree(d);
        known = e == cudaSuccess && h == 1;
    }
    return known;
}

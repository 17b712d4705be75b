// argmax.cu: greedy token on the device (lowest index on ties); only the id goes back to the host.
#include "common.cuh"

// One block; each thread scans a strided range, then a tree over (value, index) pairs.
static __global__ void argmax_kernel(const float *x, int n, int *out) {
    __shared__ float sv[1024];
    __shared__ int si[1024];
    float bv = -INFINITY;
    int bi = n; // sentinel: larger than any index
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v > bv || (v == bv && i < bi) || bi == n) {
            if (bi == n || v > bv || (v == bv && i < bi)) bv = v, bi = i;
        }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float v = sv[threadIdx.x + s];
            int i = si[threadIdx.x + s];
            if (i < n &&
                (si[threadIdx.x] == n || v > sv[threadIdx.x] || (v == sv[threadIdx.x] && i < si[threadIdx.x]))) {
                sv[threadIdx.x] = v;
                si[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = si[0] < n ? si[0] : 0;
}

extern "C" int k_argmax(const float *x, int n, int *out, void *stream) {
    argmax_kernel<<<1, 1024, 0, (cudaStream_t)stream>>>(x, n, out);
    return launch_status();
}

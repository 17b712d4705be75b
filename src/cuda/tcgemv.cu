// tcgemv.cu: a standalone tensor-core GEMV y = W x for 4-bit weights (the lab kernel for the
// building block of tcgemv.cuh; tests/gpu/test_tcgemv.c checks and times it).
#include "tcgemv.cuh"

enum { TC_WARPS = 4, TC_THREADS = TC_WARPS * WARP_SIZE, TC_MIN_BLOCKS = 5, TC_MAX_SMEM = 48 * 1024 };

// Grid-stride over 16-row tasks, a warp a task.
static __global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS)
    tc_kernel(const uint32_t *__restrict__ w, const uint16_t *__restrict__ s, const uint16_t *__restrict__ b,
              const float *__restrict__ x, float *__restrict__ y, int R, int K) {
    extern __shared__ __align__(16) unsigned char tc_smem[];
    tc_stage_x(x, K, tc_smem);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int tasks = CEIL_DIV(R, TC_ROWS);
    for (int task = blockIdx.x * TC_WARPS + warp; task < tasks; task += gridDim.x * TC_WARPS) {
        const int n0 = task * TC_ROWS;
        const float v = tc_rows16(w, s, b, R, K, n0, tc_smem);
        const int row = n0 + tc_lane_row(lane);
        if (!(lane & 1) && row < R) y[row] = v;
    }
}

extern "C" int k_tcgemv(const struct dqt *W, const float *x, float *y, void *stream) {
    if (!W || W->bits != 4 || W->cols < 64 || W->cols % 64 || W->rows < 1) return (int)cudaErrorInvalidValue;
    const int K = W->cols, R = W->rows;
    const size_t smem = (size_t)tc_smem_bytes(K);
    if (smem > TC_MAX_SMEM) return (int)cudaErrorInvalidValue;
    static int per_sm, sms;   // occupancy asked once (fixed block size; shared memory never limits)
    if (!per_sm) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) sms = 1;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tc_kernel, TC_THREADS, smem) != cudaSuccess ||
            per_sm < 1)
            per_sm = 1;
    }
    const long tasks = CEIL_DIV(R, TC_ROWS), want = CEIL_DIV(tasks, TC_WARPS), cap = (long)per_sm * sms;
    const int grid = (int)(want < cap ? want : cap);
    tc_kernel<<<grid, TC_THREADS, smem, (cudaStream_t)stream>>>(W->w, W->scales, W->biases, x, y, R, K);
    return launch_status();
}

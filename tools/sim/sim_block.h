// sim_block.h: the host shim shared by tools/sim/qmatmul_sim.cpp and tools/sim/flash_sim.cpp: a CUDA block
// as threads (threadIdx thread-local), __syncthreads a block barrier (g_bar), warp-collective
// operations (shuffles, ldmatrix .x4, mma.m16n8k16 bf16 with fp32 accumulation) as exchanges through
// shared arrays between warp barriers (g_wbar), by the PTX ISA fragment layouts, and cp.async in
// two ways (g_defer 0: copies land at once, so one landing early over data still being read shows;
// 1: each thread holds its copies until a wait_group lets their group complete, so data read before
// its wait shows). Up to SIM_WARPS (12) warps; __syncwarp is the warp barrier. Include after <barrier>, <cstring>, <vector>, "sim_bf16.h".
#pragma once

struct dim3s { unsigned x, y, z; };
static thread_local dim3s threadIdx;
[[maybe_unused]] static dim3s blockIdx, gridDim;
enum { SIM_WARPS = 12 };
static std::barrier<> *g_bar, *g_wbar[SIM_WARPS];
static void __syncthreads() { g_bar->arrive_and_wait(); }
static void wsync() { g_wbar[threadIdx.x / 32]->arrive_and_wait(); }
[[maybe_unused]] static void __syncwarp() { wsync(); }
static int swz(int r, int c) { return c ^ (r & 7); }
static float g_slot[SIM_WARPS][32];
[[maybe_unused]] static float __shfl_xor_sync(unsigned, float v, int o) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_slot[w][l] = v;
    wsync();
    const float r = g_slot[w][l ^ o];
    wsync();
    return r;
}
static int g_islot[SIM_WARPS][32];
[[maybe_unused]] static int __shfl_up_sync(unsigned, int v, int o) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_islot[w][l] = v;
    wsync();
    const int r = g_islot[w][l >= o ? l - o : l];
    wsync();
    return r;
}
static int g_vote[SIM_WARPS][32];
[[maybe_unused]] static int __any_sync(unsigned, int p) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_vote[w][l] = p != 0;
    wsync();
    int r = 0;
    for (int i = 0; i < 32; i++) r |= g_vote[w][i];
    wsync();
    return r;
}
static const void *g_addr[SIM_WARPS][32];
static void ldsm_x4(uint32_t r[4], const void *p) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_addr[w][l] = p;
    wsync();
    for (int j = 0; j < 4; j++) memcpy(&r[j], (const char *)g_addr[w][8 * j + l / 4] + 4 * (l % 4), 4);
    wsync();
}
static uint32_t g_a[SIM_WARPS][32][4], g_b[SIM_WARPS][32][2];
static void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) g_a[w][l][i] = a[i];
    g_b[w][l][0] = b0, g_b[w][l][1] = b1;
    wsync();
    double A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ln++) {
        const int gg = ln / 4, tt = ln % 4;
        for (int r = 0; r < 4; r++)   // a_r = (row g + 8 (r % 2), k 2t + 8 (r / 2), +1)
            for (int h = 0; h < 2; h++) A[gg + 8 * (r & 1)][2 * tt + h + 8 * (r >> 1)] = bf16f((uint16_t)(g_a[w][ln][r] >> (16 * h)));
        for (int r = 0; r < 2; r++)   // b_r = (k 2t + 8 r, +1; col g)
            for (int h = 0; h < 2; h++) B[2 * tt + h + 8 * r][gg] = bf16f((uint16_t)(g_b[w][ln][r] >> (16 * h)));
    }
    wsync();
    for (int r = 0; r < 4; r++) {   // c_r = (row g + 8 (r / 2), col 2t + r % 2)
        double s = 0;
        for (int k = 0; k < 16; k++) s += A[g + 8 * (r >> 1)][k] * B[k][2 * t + (r & 1)];
        c[r] = (float)(c[r] + s);
    }
}
struct cp_rec { void *dst; const void *src; int bytes; };
static int g_defer;
static thread_local std::vector<std::vector<cp_rec>> t_groups;
static thread_local std::vector<cp_rec> t_open;
static void cp_do(const cp_rec &c) {
    if (c.bytes == 16) memcpy(c.dst, c.src, 16);
    else memset(c.dst, 0, 16);
}
static void cp_async16(void *dst, const void *src, int src_bytes) {
    if (g_defer) t_open.push_back({dst, src, src_bytes});
    else cp_do({dst, src, src_bytes});
}
static void cp_async_commit() {
    t_groups.push_back(t_open);
    t_open.clear();
}
template <int N> static void cp_async_wait() {
    while (t_groups.size() > (size_t)N) {
        for (auto &c : t_groups.front()) cp_do(c);
        t_groups.erase(t_groups.begin());
    }
}

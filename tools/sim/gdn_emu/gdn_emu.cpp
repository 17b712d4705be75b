// gdn_emu.cpp: runs the CUDA kernels of src/cuda/gdn_chunked.cu on the CPU (gdn_emu.h) at a small
// head count and checks them against the fp64 recurrence of tests/gdn_ref.h: the raw output and
// state of both modes (bf16 and exact), and the gated norm. A development check of the kernels'
// indexing and synchronisation without a GPU; slow (a std::thread per CUDA thread).
//
//   make gdn-emu   (or: g++ -std=c++20 -O2 -pthread -Itools/sim/gdn_emu -Isrc -Itests -o /tmp/gdn_emu
//                  tools/sim/gdn_emu/gdn_emu.cpp && /tmp/gdn_emu [T ...])
#define GDN_HOST_EMU 1
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "gdn_emu.h"

thread_local dim3 threadIdx, blockIdx;
dim3 gridDim, blockDim;
EmuBlock *emu_blk;

#include "cuda/gdn_chunked.cu"   // -Isrc
#include "gdn_ref.h"

static void emu_launch(dim3 grid, int threads, size_t smem_floats, const std::function<void()> &kernel) {
    gridDim = grid;
    blockDim = dim3(threads);
    std::vector<float4> smem(smem_floats / 4 + 4);
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            float *sm = reinterpret_cast<float *>(smem.data());
            for (size_t i = 0; i < smem_floats; i++) sm[i] = NAN;   // poison shared memory
            std::barrier<> bar(threads);
            std::vector<EmuWarp> warps(threads / 32);
            EmuBlock blk{&bar, sm, warps.data()};
            emu_blk = &blk;
            std::vector<std::thread> th;
            for (int t = 0; t < threads; t++)
                th.emplace_back([&, t] {
                    threadIdx = dim3(t);
                    blockIdx = dim3(bx, by);
                    kernel();
                });
            for (auto &x : th) x.join();
        }
}

template <bool EXACT>
static int run(int T, int Hk, int Hv, int strong, uint64_t seed) {
    const int C = 2 * Hk * DK + Hv * DV, NC = CEIL_DIV(T, BT);
    const size_t NCT = (size_t)NC * BT, ns = (size_t)Hv * DK * DV, no = (size_t)T * Hv * DV;
    struct gdnref_rng r = {seed};
    std::vector<float> y((size_t)T * C), b((size_t)T * Hv), a((size_t)T * Hv), Al(Hv), dtb(Hv), beta(b.size()),
        g(b.size()), z(no), gn(DV);
    gdnref_inputs(&r, T, Hk, Hv, DK, DV, strong, y.data(), b.data(), a.data(), Al.data(), dtb.data());
    gdnref_gates(b.data(), a.data(), Al.data(), dtb.data(), T, Hv, beta.data(), g.data());
    for (auto &x : z) x = (float)(4 * gdnref_u(&r) - 2);
    for (auto &x : gn) x = (float)(0.5 + gdnref_u(&r));
    std::vector<double> Sr(ns), orf(no);
    std::vector<float> S(ns), o(no, NAN);
    for (size_t i = 0; i < ns; i++) S[i] = (float)(Sr[i] = (float)(0.2 * (2 * gdnref_u(&r) - 1)));
    gdnref_recurrent(y.data(), beta.data(), g.data(), Sr.data(), orf.data(), T, Hk, Hv, DK, DV);

    std::vector<float> ws(k_gdn_chunked_ws_floats(T, Hv, DK) + 4, NAN);
    float *Wg = ws.data(), *Pg = Wg + (size_t)Hv * NCT * DK, *Gg = Pg + (size_t)Hv * NCT * BT;
    emu_launch(dim3(NC, Hv), PREP_THREADS, PREP_SMEM_FLOATS, [&] {
        gdn_chunk_prep_kernel<EXACT>(y.data(), b.data(), a.data(), Al.data(), dtb.data(), o.data(), Wg, Pg, Gg, T, Hk,
                                     Hv);
    });
    emu_launch(dim3(Hv, DV / NS), STATE_THREADS, STATE_SMEM_FLOATS,
               [&] { gdn_chunk_state_kernel<EXACT>(y.data(), Wg, Pg, Gg, S.data(), o.data(), T, NC, Hk, Hv); });
    const double eo = gdnref_nerr_f(o.data(), orf.data(), no), es = gdnref_nerr_f(S.data(), Sr.data(), ns);
    // the gated norm on the kernel's raw output vs the same norm in fp64
    std::vector<double> on(o.begin(), o.end());
    gdnref_gated_norm(on.data(), z.data(), gn.data(), T, Hv, DV, 1e-6);
    const long rows = (long)T * Hv;
    emu_launch(dim3((unsigned)CEIL_DIV(rows, 8)), 256, 0,
               [&] { gdn_gated_norm_warp_kernel(o.data(), nullptr, z.data(), gn.data(), rows, DV, 1e-6f); });
    const double en = gdnref_nerr_f(o.data(), on.data(), no);
    const double tol = EXACT ? 1e-4 : 1e-2;
    const int ok = eo < tol && es < tol && en < 1e-5;
    printf("emu %-5s T %4d Hk %d Hv %d %s: o %.2e  S %.2e  norm %.2e  %s\n", EXACT ? "exact" : "bf16", T, Hk, Hv,
           strong ? "strong" : "mild  ", eo, es, en, ok ? "PASS" : "FAIL");
    fflush(stdout);
    return !ok;
}

int main(int argc, char **argv) {
    std::vector<int> Ts;
    for (int i = 1; i < argc; i++) Ts.push_back(atoi(argv[i]));
    if (Ts.empty()) Ts = {17, 150};
    int fails = 0;
    for (size_t i = 0; i < Ts.size(); i++) {
        const int hk = i % 2 ? 2 : 1;   // every other T with two key heads (head mapping)
        fails += run<true>(Ts[i], hk, 2 * hk, (int)(i & 1), 11 + i);
        fails += run<false>(Ts[i], hk, 2 * hk, (int)(i & 1), 11 + i);
    }
    printf("gdn_emu: %d failed\n", fails);
    return fails != 0;
}

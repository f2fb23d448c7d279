// Whether the last workgroup's merge in kiln's cooperative decode kernel waits on fetching its
// own machine code (a measuring instrument on the GPU machine, never part of kiln).
//
// The merge runs on the 4 SMs whose workgroups counted last, a different 4 each layer, so its
// code (8-13 KB of SASS executed once, after ~13 KB of split code) may be cold in those SMs'
// instruction caches. Every merge form that executed more code once lost in kiln (runs 442, 455,
// 475, 518, 519) while the same orders of loads won in merge_lab.cu, whose kernel is small.
// This times kiln's grid (4 heads x 33 workgroups of 128 threads, 32 KB of DRAM each, a fence
// and a count; the last of each head runs BODY) with BODY as N fused multiply-adds on eight
// independent chains (asm volatile: none removed or merged), either
//   straight: N instructions written out (N x 16 bytes of code, each run once), or
//   looped:   the same N in a loop of eight (128 bytes of code; slower warm, by its loop's own
//             instructions, but fetched once),
// for N = 512 and 1,024 (runs 520-521 also ran 256 and 2,048), with, between launches:
//   nothing, or a flusher of FK KB of straight-line code on every SM (its own time measured
//   alone and subtracted; at 160 KB the body is evicted from the SM's caches to L2; smaller
//   flushers, run 521, say how much evicts it: 16 KB already does), or
//   a streamer reading 256 MB, as kiln's decode streams its weights, with plain or evict-first
//   loads, alone or with the 160 KB flusher (runs 526-527), which puts the body out of L2 too.
// H200 (README's fiftieth section): 512 written out cost 0.13-0.31 µs warm, 0.67-0.70 from L2,
// 5.7-5.8 from beyond it (plain streamer and flusher), 0.67-0.69 with the streamer's loads
// evict-first. kiln's merge ran the same 512 at ~1.55 µs a layer (run 523).
//
//   nvcc -O3 -arch=sm_90 -o icache_lab icache_lab.cu && ./icache_lab
#include <cstdio>
#include <cuda_runtime.h>
#include "split_count.cuh"

constexpr int H = 4, S = 33, WG = 128, LOADS = 16;   // 16 x 16 B x 128 threads = 32 KB
constexpr int LAYERS = 24;
constexpr size_t KV_TOTAL = 4u << 20;

#define F(i) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(r[i]) : "f"(a), "f"(b));
#define X8 F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define X64 X8 X8 X8 X8 X8 X8 X8 X8
#define X256 X64 X64 X64 X64

template <int N, bool STRAIGHT>
__device__ __forceinline__ void body(float* r, float a, float b) {
    if constexpr (STRAIGHT) {
        if constexpr (N >= 256) { X256 }
        if constexpr (N >= 512) { X256 }
        if constexpr (N >= 1024) { X256 X256 }
        if constexpr (N >= 2048) { X256 X256 X256 X256 }
    } else {
#pragma unroll 1
        for (int k = 0; k < N / 8; k++) { X8 }
    }
}

// N = 0: no body (the grid's own time).
template <int N, bool STRAIGHT>
__global__ void grid(const uint4* __restrict__ kv_all, int layer, unsigned* done, float* out, float a, float b) {
    const int split = blockIdx.x, h = blockIdx.y, lid = threadIdx.x;
    const uint4* src = kv_all + ((size_t)layer * KV_TOTAL + (size_t)(h * S + split) * 32768) / 16;
    uint4 x[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; i++) x[i] = src[lid + i * WG];
    unsigned acc = 0;
#pragma unroll
    for (int i = 0; i < LOADS; i++) acc ^= x[i].x + x[i].w;
    out[(h * S + split) * WG + lid] = (float)(acc & 1023);
    const unsigned last = count_split_done(done, h, S);
    if (last + 1 != S) return;
    float r[8];
#pragma unroll
    for (int i = 0; i < 8; i++) r[i] = (float)(acc & 7) + i;
    if constexpr (N > 0) body<N, STRAIGHT>(r, a, b);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) s += r[i];
    out[H * S * WG + h * WG + lid] = s;
}

// FK KB of straight-line code on every SM (FK x 64 instructions a thread), run between launches.
template <int FK>
__global__ void flusher(float* out, float a, float b) {
    float r[8];
#pragma unroll
    for (int i = 0; i < 8; i++) r[i] = threadIdx.x + i;
    if constexpr (FK % 32 == 16) { X256 X256 X256 X256 }
#pragma unroll
    for (int k = 0; k < FK / 32; k++) { X256 X256 X256 X256 X256 X256 X256 X256 }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) s += r[i];
    if (s == 1234.5f) out[0] = s;
}

// Reads `n` 16-byte vectors once (all SMs, grid-stride), as decode's GEMVs stream their weights
// through L2: plain loads, or evict-first ones (`__ldcs`, ld.global.cs) where EF.
template <bool EF>
__global__ void streamer(const uint4* __restrict__ src, size_t n, float* out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 x = EF ? __ldcs(src + i) : src[i];
        acc ^= x.x + x.w;
    }
    if (acc == 0x12345678u) out[0] = (float)acc;
}

struct Ctx { const uint4* kv; unsigned* done; float* out; const uint4* big; };

// Best of 5 timings of 1,000 launches (each followed by the flusher where `flush`), µs a launch.
template <typename Launch>
float time_it(Launch launch) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    float best = 1e30f;
    const int launches = 1000;
    for (int rep = 0; rep < 5; rep++) {
        launch(0);
        cudaEventRecord(e0);
        for (int l = 0; l < launches; l++) launch(l);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        best = fminf(best, ms * 1000.f / launches);
    }
    return best;
}

template <int N, bool STRAIGHT, int FK>
float measure(Ctx c) {
    return time_it([&](int l) {
        grid<N, STRAIGHT><<<dim3(S, H), WG>>>(c.kv, l % LAYERS, c.done, c.out, 1.0000001f, 1e-7f);
        if (FK > 0) flusher<FK><<<132, 128>>>(c.out, 1.0000001f, 1e-7f);
    });
}

// The grid with a body of N instructions, straight and looped, each launch followed by a flusher of
// FK KB (none at 0): µs a launch above the grid and the flusher alone.
template <int N, int FK>
void row(Ctx c) {
    float fl = FK > 0 ? time_it([&](int) { flusher<FK><<<132, 128>>>(c.out, 1.0000001f, 1e-7f); }) : 0.f;
    float base = measure<0, true, FK>(c);
    float s = measure<N, true, FK>(c) - base, l = measure<N, false, FK>(c) - base;
    printf("flusher %3d KB (alone %.3f, grid %.3f): N=%4d (%2d KB) straight %.3f, looped %.3f, straight - looped %+.3f us (%s)\n",
           FK, fl, base - fl, N, N * 16 / 1024, s, l, s - l, cudaGetErrorString(cudaGetLastError()));
}

constexpr size_t BIG = 256u << 20;   // bytes the streamer reads between launches

// The grid with a body of N instructions, straight and looped, each launch followed by the
// streamer: µs a launch above the grid and the streamer alone.
template <int N, bool EF, bool FLUSH = false>
void stream_row(Ctx c) {
    auto st = [&] {
        streamer<EF><<<132 * 4, 512>>>(c.big, BIG / 16, c.out);
        if (FLUSH) flusher<160><<<132, 128>>>(c.out, 1.0000001f, 1e-7f);
    };
    float alone = time_it([&](int) { st(); });
    auto with = [&](auto body) { return time_it([&](int l) { body(l); st(); }); };
    float base = with([&](int l) { grid<0, true><<<dim3(S, H), WG>>>(c.kv, l % LAYERS, c.done, c.out, 1.0000001f, 1e-7f); });
    float s = with([&](int l) { grid<N, true><<<dim3(S, H), WG>>>(c.kv, l % LAYERS, c.done, c.out, 1.0000001f, 1e-7f); }) - base;
    float lp = with([&](int l) { grid<N, false><<<dim3(S, H), WG>>>(c.kv, l % LAYERS, c.done, c.out, 1.0000001f, 1e-7f); }) - base;
    printf("%s 256 MB%s between launches (alone %.3f, grid %.3f): N=%4d (%2d KB) straight %.3f, looped %.3f us (%s)\n",
           EF ? "evict-first" : "plain load ", FLUSH ? " and the 160 KB flusher" : "", alone, base - alone, N, N * 16 / 1024, s, lp, cudaGetErrorString(cudaGetLastError()));
}

int main() {
    Ctx c;
    uint4* kv; cudaMalloc(&kv, (size_t)LAYERS * KV_TOTAL);
    cudaMemset(kv, 1, (size_t)LAYERS * KV_TOTAL);
    c.kv = kv;
    cudaMalloc(&c.done, H * sizeof(unsigned)); cudaMemset(c.done, 0, H * sizeof(unsigned));
    cudaMalloc(&c.out, (H * S * WG + H * WG) * sizeof(float));
    uint4* big; cudaMalloc(&big, BIG); cudaMemset(big, 1, BIG);
    c.big = big;
    for (int round = 0; round < 2; round++) {
        // What cold code costs a KB (run 520: with 160 KB flushed, the body's fetch from L2).
        row<512, 0>(c); row<1024, 0>(c);
        row<512, 160>(c); row<1024, 160>(c);
        // Code evicted from L2 too (run 526): 256 MB read between launches, as kiln's decode
        // streams its weights; plain or evict-first loads.
        stream_row<512, false>(c); stream_row<1024, false>(c);
        stream_row<512, true>(c); stream_row<1024, true>(c);
        // Both (run 527): the body out of the SM's instruction caches and, after plain loads,
        // out of L2 too, as kiln's merge code may be between two layers.
        stream_row<512, false, true>(c); stream_row<1024, false, true>(c);
        stream_row<512, true, true>(c); stream_row<1024, true, true>(c);
    }
    return 0;
}

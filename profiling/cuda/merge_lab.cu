// What a decode-attention merge over many splits waits on, measured in CUDA where Nsight Compute
// can say (a measuring instrument on the GPU machine, never part of kiln).
//
// It mimics kiln's cooperative decode kernel at TinyLlama's depth 4,096 (wgsl/attention_decode_coop.wgsl
// with common/decode_merge.wgsl's `merge_shuffled`): a grid of S splits x H KV heads, workgroups of
// 128 threads; each reads its share of a K/V-sized buffer (32 KB), writes its partial rows (G heads x
// (16 float4 values + 1 float4 of max and sum)), fences, counts itself on its head's counter, and the
// last of a head's splits merges them: thread (head hh, vector c) loads 4 splits' statistics, then
// every split's values, the statistics shuffled from the head's threads, a running max and sum.
// `n_merge` merges only the first n_merge splits (as kiln's m1 / m8 probes of run 508).
//
//   nvcc -O3 -arch=sm_90 -o merge_lab merge_lab.cu
//   ./merge_lab [MODE [n_merge ...]]   per-launch µs, best of 5 timings of 2000 launches back to back
//   ncu --section WarpStateStats --section SourceCounters -k regex:split_merge -c 1 ./merge_lab 0 33
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "split_count.cuh"

constexpr int S = 33, H = 4, G = 8, PER = 16, RS_MAX = 24, WG = 128;
constexpr int KV_BYTES_PER_BLOCK = 32 * 1024;
// Launches cycle over this many K/V regions (layers), 104 MB in all: more than the L2 holds, so
// each launch's shares come from DRAM as a layer's cache does in a step.
constexpr int LAYERS = 24;

__device__ __forceinline__ float4 ld_cg(const float4* p) { return __ldcg(p); }
__device__ float4* g_old;   // mode 3's partials, written once before the timing

// The head's largest max over the statistics of its first n splits (slots c + q PER, q < 4,
// of each of its PER lanes), each slot's weight against it (0 past n), and the head's sum,
// through shuffles among the head's lanes (the weights-once merges: modes 1, 7-11).
__device__ __forceinline__ float head_weights(const float2 (&st)[4], int c, int n, float (&w4)[4]) {
    float hm = -3.4e38f, t = 0.f;
#pragma unroll
    for (int q = 0; q < 4; q++) if (c + q * PER < n) hm = fmaxf(hm, st[q].x);
#pragma unroll
    for (int off = PER / 2; off > 0; off /= 2) hm = fmaxf(hm, __shfl_xor_sync(0xffffffffu, hm, off));
#pragma unroll
    for (int q = 0; q < 4; q++) { w4[q] = c + q * PER < n ? __expf(st[q].x - hm) : 0.f; t = fmaf(w4[q], st[q].y, t); }
#pragma unroll
    for (int off = PER / 2; off > 0; off /= 2) t += __shfl_xor_sync(0xffffffffu, t, off);
    return t;
}

// MODE 0: the merge's loads in rounds of 8 (a loop); 1: every split's values loaded at once (up
// to 40, predicated, unrolled), then weighed against the head's max taken from the statistics
// first; 2: as 0 with rounds of 16 (as kiln's merge_shuffled); 3: as 2 reading a copy of the
// partials written before the timing (not this launch's); 4: as 2 with plain (L1-cached) loads;
// 5: as 2 with every thread of a head loading its vector 0 (16x fewer bytes; values wrong); 6: as
// 2 with rows of 24 float4 (384 bytes: each row's values in three whole 128-byte lines); 7: each
// split's weight computed once per head from the statistics (the head's max and sum first, by
// shuffles), then a split costs a load, one shuffle and a multiply-add (kiln's run 509); 8: as 7
// with no shuffle (every weight 1: the loads and multiply-adds alone; values wrong); 9: as 7 in
// workgroups of 256 threads, the second 128 idle in the split phase and each output vector's
// splits shared by two threads of a warp (the first 17 and the rest), met by a shuffle; 10: as 7
// where n is 33, in two rounds (splits 0-15 with 32, then 16-31) instead of three; 11: as 7
// where n is 33, all 33 loads in one round (other n: as 7).
template <int MODE>
__global__ void split_merge(const uint4* __restrict__ kv_all, int layer, float4* part, unsigned* done, float4* out, int n_merge) {
    constexpr int RS = MODE == 6 ? 24 : PER + 1;
    constexpr int LC = MODE == 5 ? 0 : 1;   // the loads' vector: c, or 0
    const int split = blockIdx.x, h = blockIdx.y, lid = threadIdx.x;
    // The split's reads: 32 KB a block, 16 loads of 16 bytes a thread, all in flight.
    const uint4* kv = kv_all + (size_t)layer * H * S * KV_BYTES_PER_BLOCK / 16;
    const uint4* src = kv + ((size_t)(h * S + split) * KV_BYTES_PER_BLOCK) / 16;
    uint4 acc = make_uint4(0, 0, 0, 0);
    uint4 x[16];
    const int sl = lid % WG;   // mode 9's second 128 threads repeat the first's loads' addresses
#pragma unroll
    for (int i = 0; i < 16; i++) x[i] = lid < WG ? src[sl + i * WG] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 16; i++) { acc.x ^= x[i].x; acc.y += x[i].y; acc.z ^= x[i].z; acc.w += x[i].w; }
    // Its partial rows: G heads x RS float4.
    for (int i = lid; i < G * RS && lid < WG; i += WG) {
        int hh = i / RS, c = i % RS;
        float v = (float)((acc.x ^ (unsigned)i) & 1023) * 1e-3f;
        float4 val = c < PER ? make_float4(v, v + 1, v + 2, v + 3) : make_float4((float)(split % 7), 1.0f + v, 0, 0);
        part[((h * G + hh) * S + split) * RS + c] = val;
    }
    const unsigned last = count_split_done(done, h, S);
    if (last + 1 != S) return;
    if (MODE == 9) {
        // Two threads an output vector: lane c and c + 16 of the head's warp.
        const int hh = lid / 32, c = lid % PER, half = (lid % 32) / PER;
        const int n = n_merge, lastS = n - 1;
        const float4* rows = part + (size_t)(h * G + hh) * S * RS;
        float2 st[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float4 s4 = ld_cg(rows + min(c + q * PER, lastS) * RS + PER);
            st[q] = make_float2(s4.x, s4.y);
        }
        float w4[4];
        float t = head_weights(st, c, n, w4);
        const int mid = (n + 1) / 2, s0 = half ? mid : 0, s1 = half ? n : mid;
        float4 a = make_float4(0, 0, 0, 0);
        int s = s0;
        // Both halves run the same number of iterations (uniform shuffles): the second's extra one,
        // where n is odd, is skipped by its weight 0 and a clamped row.
        for (int i = 0; i < mid; i += 16) {
            float4 v[16];
#pragma unroll
            for (int k = 0; k < 16; k++) v[k] = ld_cg(rows + min(s + i + k, n - 1) * RS + c);
#pragma unroll
            for (int k = 0; k < 16; k++) {
                int sk = s + i + k;
                float wq = sk / PER == 0 ? w4[0] : sk / PER == 1 ? w4[1] : sk / PER == 2 ? w4[2] : w4[3];
                float w = __shfl_sync(0xffffffffu, wq, half * PER + sk % PER);
                w = (i + k < mid && sk < s1) ? w : 0.f;
                a.x = fmaf(w, v[k].x, a.x); a.y = fmaf(w, v[k].y, a.y); a.z = fmaf(w, v[k].z, a.z); a.w = fmaf(w, v[k].w, a.w);
            }
        }
        a.x += __shfl_xor_sync(0xffffffffu, a.x, PER); a.y += __shfl_xor_sync(0xffffffffu, a.y, PER);
        a.z += __shfl_xor_sync(0xffffffffu, a.z, PER); a.w += __shfl_xor_sync(0xffffffffu, a.w, PER);
        float it = 1.f / t;
        if (half == 0) out[(h * G + hh) * PER + c] = make_float4(a.x * it, a.y * it, a.z * it, a.w * it);
        return;
    }
    // The merge (`merge_shuffled`): one float4 of output a thread.
    const int hh = lid / PER, c = lid % PER, hl = (lid % 32) - c;
    const int n = n_merge, lastS = n - 1;
    const float4* rows = (MODE == 3 ? g_old : part) + (size_t)(h * G + hh) * S * RS;
    float2 st[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float4 s4 = ld_cg(rows + min(c + q * PER, lastS) * RS + PER);
        st[q] = make_float2(s4.x, s4.y);
    }
    float m = -3.4e38f, t = 0.f;
    float4 a = make_float4(0, 0, 0, 0);
    int s = 0;
    if (MODE == 1) {
        float4 v[40];
#pragma unroll
        for (int k = 0; k < 40; k++) v[k] = k < n ? ld_cg(rows + k * RS + c) : make_float4(0, 0, 0, 0);
        // The head's max and each slot's weight, from the statistics alone.
        float w4[4];
        t = head_weights(st, c, n, w4);
#pragma unroll
        for (int k = 0; k < 40; k++) {
            float w = __shfl_sync(0xffffffffu, w4[k / PER], hl + k % PER);
            a.x = fmaf(w, v[k].x, a.x); a.y = fmaf(w, v[k].y, a.y); a.z = fmaf(w, v[k].z, a.z); a.w = fmaf(w, v[k].w, a.w);
        }
        float it = 1.f / t;
        out[(h * G + hh) * PER + c] = make_float4(a.x * it, a.y * it, a.z * it, a.w * it);
        return;
    }
    if ((MODE == 10 || MODE == 11) && n == S) {
        float w4[4];
        t = head_weights(st, c, n, w4);
        auto add = [&](float4 v, int k) {
            float w = __shfl_sync(0xffffffffu, w4[k / PER], hl + k % PER);
            a.x = fmaf(w, v.x, a.x); a.y = fmaf(w, v.y, a.y); a.z = fmaf(w, v.z, a.z); a.w = fmaf(w, v.w, a.w);
        };
        if (MODE == 11) {
            float4 v[S];
#pragma unroll
            for (int k = 0; k < S; k++) v[k] = ld_cg(rows + k * RS + c);
#pragma unroll
            for (int k = 0; k < S; k++) add(v[k], k);
        } else {
            float4 v[17];
#pragma unroll
            for (int k = 0; k < 16; k++) v[k] = ld_cg(rows + k * RS + c);
            v[16] = ld_cg(rows + 32 * RS + c);
#pragma unroll
            for (int k = 0; k < 16; k++) add(v[k], k);
            add(v[16], 32);
#pragma unroll
            for (int k = 0; k < 16; k++) v[k] = ld_cg(rows + (16 + k) * RS + c);
#pragma unroll
            for (int k = 0; k < 16; k++) add(v[k], 16 + k);
        }
        float it = 1.f / t;
        out[(h * G + hh) * PER + c] = make_float4(a.x * it, a.y * it, a.z * it, a.w * it);
        return;
    }
    if (MODE == 7 || MODE == 8 || MODE == 10 || MODE == 11) {
        float w4[4];
        t = head_weights(st, c, n, w4);
        for (; s + 15 < n; s += 16) {
            float4 v[16];
#pragma unroll
            for (int k = 0; k < 16; k++) v[k] = ld_cg(rows + (s + k) * RS + c);
            float wq = s / PER == 0 ? w4[0] : s / PER == 1 ? w4[1] : s / PER == 2 ? w4[2] : w4[3];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                float w = MODE == 8 ? 1.f : __shfl_sync(0xffffffffu, wq, hl + (s + k) % PER);
                a.x = fmaf(w, v[k].x, a.x); a.y = fmaf(w, v[k].y, a.y); a.z = fmaf(w, v[k].z, a.z); a.w = fmaf(w, v[k].w, a.w);
            }
        }
        for (; s < n; s++) {
            float4 v = ld_cg(rows + s * RS + c);
            float wq = s / PER == 0 ? w4[0] : s / PER == 1 ? w4[1] : s / PER == 2 ? w4[2] : w4[3];
            float w = MODE == 8 ? 1.f : __shfl_sync(0xffffffffu, wq, hl + s % PER);
            a.x = fmaf(w, v.x, a.x); a.y = fmaf(w, v.y, a.y); a.z = fmaf(w, v.z, a.z); a.w = fmaf(w, v.w, a.w);
        }
        float it = 1.f / t;
        out[(h * G + hh) * PER + c] = make_float4(a.x * it, a.y * it, a.z * it, a.w * it);
        return;
    }
    constexpr int ROUND = MODE >= 2 ? 16 : 8;
    for (; s + ROUND - 1 < n; s += ROUND) {
        float4 v[ROUND];
#pragma unroll
        for (int k = 0; k < ROUND; k++) v[k] = MODE == 4 ? rows[(s + k) * RS + c] : ld_cg(rows + (s + k) * RS + LC * c);
        float mx[ROUND], sm[ROUND];
#pragma unroll
        for (int k = 0; k < ROUND; k++) {
            float2 cur = st[(s + k) / PER];
            int j = hl + (s + k) % PER;
            mx[k] = __shfl_sync(0xffffffffu, cur.x, j);
            sm[k] = __shfl_sync(0xffffffffu, cur.y, j);
        }
        float m8 = m;
#pragma unroll
        for (int k = 0; k < ROUND; k++) m8 = fmaxf(m8, mx[k]);
        float r = __expf(m - m8);
        a.x *= r; a.y *= r; a.z *= r; a.w *= r; t *= r;
#pragma unroll
        for (int k = 0; k < ROUND; k++) {
            float w = __expf(mx[k] - m8);
            a.x = fmaf(w, v[k].x, a.x); a.y = fmaf(w, v[k].y, a.y); a.z = fmaf(w, v[k].z, a.z); a.w = fmaf(w, v[k].w, a.w);
            t = fmaf(w, sm[k], t);
        }
        m = m8;
    }
    for (; s < n; s++) {
        float4 v = ld_cg(rows + s * RS + c);
        float2 cur = st[s / PER];
        int j = hl + s % PER;
        float mx = __shfl_sync(0xffffffffu, cur.x, j), sm = __shfl_sync(0xffffffffu, cur.y, j);
        float m1 = fmaxf(m, mx), r = __expf(m - m1), w = __expf(mx - m1);
        a.x = fmaf(w, v.x, a.x * r); a.y = fmaf(w, v.y, a.y * r); a.z = fmaf(w, v.z, a.z * r); a.w = fmaf(w, v.w, a.w * r);
        t = fmaf(w, sm, t * r);
        m = m1;
    }
    float it = 1.f / t;
    out[(h * G + hh) * PER + c] = make_float4(a.x * it, a.y * it, a.z * it, a.w * it);
}

int main(int argc, char** argv) {
    uint4* kv; float4 *part, *out; unsigned* done;
    size_t kv_bytes = (size_t)LAYERS * H * S * KV_BYTES_PER_BLOCK;
    cudaMalloc(&kv, kv_bytes);
    cudaMemset(kv, 1, kv_bytes);
    cudaMalloc(&part, (size_t)H * G * S * RS_MAX * sizeof(float4));
    cudaMalloc(&out, (size_t)H * G * PER * sizeof(float4));
    cudaMalloc(&done, H * sizeof(unsigned));
    cudaMemset(done, 0, H * sizeof(unsigned));
    float4* old;
    size_t part_bytes = (size_t)H * G * S * RS_MAX * sizeof(float4);
    cudaMalloc(&old, part_bytes);
    split_merge<0><<<dim3(S, H), WG>>>(kv, 0, part, done, out, 1);
    cudaMemcpy(old, part, part_bytes, cudaMemcpyDeviceToDevice);
    cudaMemcpyToSymbol(g_old, &old, sizeof(old));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    int ns[8] = {1, 8, 16, 33}, count = 4;
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    if (argc > 2) { count = 0; for (int i = 2; i < argc && count < 8; i++) ns[count++] = atoi(argv[i]); }
    auto launch = [&](int layer, int n) {
        if (mode == 1) split_merge<1><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 2) split_merge<2><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 3) split_merge<3><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 4) split_merge<4><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 5) split_merge<5><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 6) split_merge<6><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 7) split_merge<7><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 8) split_merge<8><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 9) split_merge<9><<<dim3(S, H), 2 * WG>>>(kv, layer, part, done, out, n);
        else if (mode == 10) split_merge<10><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else if (mode == 11) split_merge<11><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
        else split_merge<0><<<dim3(S, H), WG>>>(kv, layer, part, done, out, n);
    };
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < count; i++) {
            float best = 1e30f;
            for (int rep = 0; rep < 5; rep++) {
                const int launches = 2000;
                launch(0, ns[i]);
                cudaEventRecord(e0);
                for (int l = 0; l < launches; l++) launch(l % LAYERS, ns[i]);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1);
                best = fminf(best, ms * 1000.f / launches);
            }
            printf("mode %d round %d  merge over %2d of %d splits: %.3f us a launch\n", mode, round, ns[i], S, best);
        }
    }
    float4 o; cudaMemcpy(&o, out, sizeof(o), cudaMemcpyDeviceToHost);
    printf("check %f %f (error: %s)\n", o.x, o.y, cudaGetErrorString(cudaGetLastError()));
    return 0;
}

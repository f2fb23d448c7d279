// How many splits decode attention's K/V should be cut into at TinyLlama's depth 4,096, as far as
// memory and the merge decide it (a measuring instrument on the GPU machine, never part of kiln).
//
// kiln's cooperative decode kernel cuts 4,224 positions of 4 KV heads into 33 splits of 128 (132
// workgroups of 128 threads, 32 KB of K and V each), and the last workgroup of a head merges 33
// partials (merge_lab.cu: it waits a round trip a round of its loads). Fewer, larger splits merge
// faster but load more a workgroup. This times the split-and-merge pattern alone (no attention
// arithmetic: each workgroup reads its share, writes its partial rows, fences and counts; the last
// merges with the weights taken once per head and every split's loads in rounds of 16, the
// splits past the last whole 16 with the first round: merge_lab.cu's mode 10, generalized) for:
//   S splits of KVB bytes a workgroup, WG threads (loads a thread = KVB / 16 / WG):
//   33 x 32 KB x 128 (kiln now), 17 x 64 KB x 128, 17 x 64 KB x 256, 9 x 128 KB x 256.
// Not checked against run results yet (written in session 49, after its device time was spent).
// Its split phase and merge prologue are merge_lab.cu's, written out: each lab is one file nvcc
// builds alone.
//
//   nvcc -O3 -arch=sm_90 -o split_lab split_lab.cu && ./split_lab
#include <cstdio>
#include <cuda_runtime.h>
#include "split_count.cuh"

constexpr int H = 4, G = 8, PER = 16, RS = PER + 1;
constexpr int LAYERS = 24;              // K/V regions cycled so that every launch reads DRAM
constexpr size_t KV_TOTAL = 4u << 20;   // 4 MiB of K and V a layer (4,224 positions would be 4.1)

template <int S, int KVB, int WG>
__global__ void split_merge(const uint4* __restrict__ kv_all, int layer, float4* part, unsigned* done, float4* out) {
    constexpr int LOADS = KVB / 16 / WG;
    const int split = blockIdx.x, h = blockIdx.y, lid = threadIdx.x;
    const uint4* src = kv_all + ((size_t)layer * KV_TOTAL + (size_t)(h * S + split) * KVB) / 16;
    uint4 acc = make_uint4(0, 0, 0, 0);
    uint4 x[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; i++) x[i] = src[lid + i * WG];
#pragma unroll
    for (int i = 0; i < LOADS; i++) { acc.x ^= x[i].x; acc.y += x[i].y; acc.z ^= x[i].z; acc.w += x[i].w; }
    for (int i = lid; i < G * RS; i += WG) {
        int hh = i / RS, c = i % RS;
        float v = (float)((acc.x ^ (unsigned)i) & 1023) * 1e-3f;
        float4 val = c < PER ? make_float4(v, v + 1, v + 2, v + 3) : make_float4((float)(split % 7), 1.0f + v, 0, 0);
        part[((h * G + hh) * S + split) * RS + c] = val;
    }
    const unsigned last = count_split_done(done, h, S);
    if (last + 1 != S || lid >= G * PER) return;
    // The merge: one float4 of output a thread (the first G * PER threads).
    const int hh = lid / PER, c = lid % PER, hl = (lid % 32) - c;
    const float4* rows = part + (size_t)(h * G + hh) * S * RS;
    float2 st[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float4 s4 = __ldcg(rows + min(c + q * PER, S - 1) * RS + PER);
        st[q] = make_float2(s4.x, s4.y);
    }
    float hm = -3.4e38f, t = 0.f;
#pragma unroll
    for (int q = 0; q < 4; q++) if (c + q * PER < S) hm = fmaxf(hm, st[q].x);
#pragma unroll
    for (int off = PER / 2; off > 0; off /= 2) hm = fmaxf(hm, __shfl_xor_sync(0xffffffffu, hm, off));
    float w4[4];
#pragma unroll
    for (int q = 0; q < 4; q++) { w4[q] = c + q * PER < S ? __expf(st[q].x - hm) : 0.f; t = fmaf(w4[q], st[q].y, t); }
#pragma unroll
    for (int off = PER / 2; off > 0; off /= 2) t += __shfl_xor_sync(0xffffffffu, t, off);
    float4 a = make_float4(0, 0, 0, 0);
    auto add = [&](float4 v, int k) {
        float w = __shfl_sync(0xffffffffu, w4[k / PER], hl + k % PER);
        a.x = fmaf(w, v.x, a.x); a.y = fmaf(w, v.y, a.y); a.z = fmaf(w, v.z, a.z); a.w = fmaf(w, v.w, a.w);
    };
    // Rounds of 16, the splits past the last whole 16 loaded with the first round.
    constexpr int FULL = S / 16 * 16, TAIL = S - FULL;
    constexpr int FIRST = FULL >= 16 ? 16 : 0;
    float4 v[FIRST + TAIL > 0 ? FIRST + TAIL : 1];
#pragma unroll
    for (int k = 0; k < FIRST; k++) v[k] = __ldcg(rows + k * RS + c);
#pragma unroll
    for (int k = 0; k < TAIL; k++) v[FIRST + k] = __ldcg(rows + (FULL + k) * RS + c);
#pragma unroll
    for (int k = 0; k < FIRST; k++) add(v[k], k);
#pragma unroll
    for (int k = 0; k < TAIL; k++) add(v[FIRST + k], FULL + k);
#pragma unroll
    for (int s = FIRST; s < FULL; s += 16) {
        float4 u[16];
#pragma unroll
        for (int k = 0; k < 16; k++) u[k] = __ldcg(rows + (s + k) * RS + c);
#pragma unroll
        for (int k = 0; k < 16; k++) add(u[k], s + k);
    }
    float it = 1.f / t;
    out[(h * G + hh) * PER + c] = make_float4(a.x * it, a.y * it, a.z * it, a.w * it);
}

template <int S, int KVB, int WG>
void measure(const uint4* kv, float4* part, unsigned* done, float4* out) {
    static_assert((size_t)S * KVB * H <= KV_TOTAL + 4 * KVB * H, "a layer's share");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    float best = 1e30f;
    for (int rep = 0; rep < 5; rep++) {
        const int launches = 2000;
        split_merge<S, KVB, WG><<<dim3(S, H), WG>>>(kv, 0, part, done, out);
        cudaEventRecord(e0);
        for (int l = 0; l < launches; l++) split_merge<S, KVB, WG><<<dim3(S, H), WG>>>(kv, l % LAYERS, part, done, out);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        best = fminf(best, ms * 1000.f / launches);
    }
    float4 o; cudaMemcpy(&o, out, sizeof(o), cudaMemcpyDeviceToHost);
    printf("%2d splits x %3d KB x %3d threads (%2d loads a thread): %.3f us a launch (check %.4f, %s)\n", S,
           KVB / 1024, WG, KVB / 16 / WG, best, o.y, cudaGetErrorString(cudaGetLastError()));
}

int main() {
    uint4* kv; float4 *part, *out; unsigned* done;
    // Room for the largest share past the layer's 4 MiB (9 x 128 KB x 4 = 4.5 MiB).
    cudaMalloc(&kv, (size_t)LAYERS * KV_TOTAL + (1u << 20));
    cudaMemset(kv, 1, (size_t)LAYERS * KV_TOTAL + (1u << 20));
    cudaMalloc(&part, (size_t)H * G * 33 * RS * sizeof(float4));
    cudaMalloc(&out, (size_t)H * G * PER * sizeof(float4));
    cudaMalloc(&done, H * sizeof(unsigned));
    cudaMemset(done, 0, H * sizeof(unsigned));
    for (int round = 0; round < 2; round++) {
        measure<33, 32 * 1024, 128>(kv, part, done, out);
        measure<17, 64 * 1024, 128>(kv, part, done, out);
        measure<17, 64 * 1024, 256>(kv, part, done, out);
        measure<9, 128 * 1024, 256>(kv, part, done, out);
    }
    return 0;
}

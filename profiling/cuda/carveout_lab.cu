// Whether an SM pays for changing its shared-memory carveout between consecutive kernels (a
// measuring instrument on the GPU machine, never part of kiln).
//
// At depth 4,096 kiln's decode step runs its cooperative attention kernel (44,804 bytes of
// workgroup memory) between GEMVs that use at most a few KB; at depth 0 the plain attention kernel
// (~3 KB) does not change what the GEMVs around it use. If the driver gives each kernel its own
// split of L1 and shared memory, every switch may wait for the SM to drain and reconfigure.
// This times kernels of kiln's decode grids alone and alternating:
//   G: a GEMV-like grid, 1,024 blocks of 128 threads, SG bytes of shared memory (0 or 4 KB);
//   A: an attention-like grid, 132 blocks of 128 threads, 44,800 bytes of shared memory;
// each block reads 16 KB (G: 2 KB) from a buffer and writes a little. Alternation's cost above
// the mean of the two alone is the switch; then again with G's carveout preference set to the
// attention kernel's (cudaFuncAttributePreferredSharedMemoryCarveout), which CUDA can say and
// Vulkan cannot. H200 (run 522): alternation costs what the two cost alone, within ±0.2 µs, with or
// without the preference: no switch cost.
//
//   nvcc -O3 -arch=sm_90 -o carveout_lab carveout_lab.cu && ./carveout_lab
#include <cstdio>
#include <cuda_runtime.h>

constexpr int T = 128;

template <int SMEM, int LOADS>
__global__ void grid(const float4* __restrict__ in, float* out) {
    __shared__ float4 sm[SMEM / 16 > 0 ? SMEM / 16 : 1];
    const int t = threadIdx.x, b = blockIdx.x;
    float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < LOADS; i++) {
        float4 x = in[(size_t)(b * LOADS + i) * T + t];
        acc.x += x.x; acc.y += x.y; acc.z += x.z; acc.w += x.w;
    }
    if constexpr (SMEM > 0) {
        for (int i = t; i < SMEM / 16; i += T) sm[i] = acc;
        __syncthreads();
        acc.x += sm[(t * 7 + 1) % (SMEM / 16)].y;
    }
    out[b * T + t] = acc.x + acc.y + acc.z + acc.w;
}

constexpr int GB = 1024, AB = 132;
constexpr int A_SMEM = 44800;

template <typename Launch>
float time_it(Launch launch) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    float best = 1e30f;
    const int n = 1000;
    for (int rep = 0; rep < 5; rep++) {
        launch();
        cudaEventRecord(e0);
        for (int l = 0; l < n; l++) launch();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        best = fminf(best, ms * 1000.f / n);
    }
    return best;
}

template <int SG>
void pair(const float4* in, float* out, const char* what) {
    auto g = [&] { grid<SG, 1><<<GB, T>>>(in, out); };
    auto a = [&] { grid<A_SMEM, 8><<<AB, T>>>(in, out + GB * T); };
    float tg = time_it(g), ta = time_it(a);
    float tga = time_it([&] { g(); a(); });
    float tgg = time_it([&] { g(); g(); }), taa = time_it([&] { a(); a(); });
    printf("%-34s G alone %.3f, A alone %.3f, GG %.3f, AA %.3f, GA %.3f us; GA - (GG + AA) / 2 = %+.3f us (%s)\n", what, tg,
           ta, tgg, taa, tga, tga - (tgg + taa) / 2, cudaGetErrorString(cudaGetLastError()));
}

int main() {
    float4* in; float* out;
    cudaMalloc(&in, (size_t)GB * 8 * T * sizeof(float4));
    cudaMemset(in, 0, (size_t)GB * 8 * T * sizeof(float4));
    cudaMalloc(&out, (size_t)(GB + AB) * T * sizeof(float));
    for (int round = 0; round < 2; round++) {
        cudaFuncSetAttribute(grid<0, 1>, cudaFuncAttributePreferredSharedMemoryCarveout, -1);
        cudaFuncSetAttribute(grid<4096, 1>, cudaFuncAttributePreferredSharedMemoryCarveout, -1);
        pair<0>(in, out, "G without shared memory:");
        pair<4096>(in, out, "G with 4 KB:");
        // G made to ask for the most shared memory, as the attention kernel's occupancy would.
        cudaFuncSetAttribute(grid<0, 1>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
        cudaFuncSetAttribute(grid<4096, 1>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
        pair<0>(in, out, "G without, carveout 100%:");
        pair<4096>(in, out, "G with 4 KB, carveout 100%:");
    }
    return 0;
}

// A measurement, not part of kiln (which never depends on CUDA): what NVIDIA's own path
// (mma.sync, ldmatrix) reaches in the shape of kiln's cooperative GEMM (wgsl/gemm_coop.wgsl),
// so that a gap is known to be the structure's or the Vulkan path's. On the GPU machine:
//   nvcc -O3 -arch=sm_90 -o mma2 mma_skeleton_tiles.cu && ./mma2   (H200 run 433)
// GEMM skeleton without global loads: BM x BN tiles of 64x64 warps, K steps of BK per barrier,
// double-buffered padded shared tiles (rows of BK + 8 halves), fragment loads (ldmatrix) and
// mma.sync m16n8k16 f32, each step's next tile stored (3 STS.128-equivalent per 16 K) after its
// products, one barrier a step. Grid: the 4096^3 GEMM's tiles.
#include <cstdio>
#include <cuda_fp16.h>
#include <cstdint>
#define MMA(d, a, b) asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#define LDSM4(r, addr) asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" \
    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr))

template <int BM, int BN, int BK, int MINB>
__global__ void __launch_bounds__((BM / 64) * (BN / 64) * 32, MINB) k(float* out, int steps) {
    constexpr int NT = (BM / 64) * (BN / 64) * 32, LD = BK + 8, BUF = (BM + BN) * LD;
    constexpr int CHUNKS = (BM + BN) * BK / 8;
    extern __shared__ __align__(16) half sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / (BN / 64), wn = warp % (BN / 64);
    float acc[4][8][4] = {};
    for (int i = threadIdx.x; i < 2 * BUF; i += NT) sm[i] = __float2half(0.001f * (i % 13));
    __syncthreads();
    uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    for (int s = 0; s < steps; s++) {
        uint32_t a0 = base + 2 * ((s % 2) * BUF), b0 = a0 + 2 * BM * LD;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[4][4], bf[4][4];
            for (int i = 0; i < 4; i++) LDSM4(af[i], a0 + 2 * ((wm * 64 + i * 16 + lane % 16) * LD + kk + (lane / 16) * 8));
            for (int j = 0; j < 4; j++) LDSM4(bf[j], b0 + 2 * ((wn * 64 + j * 16 + lane % 8 + (lane / 16) * 8) * LD + kk + ((lane / 8) % 2) * 8));
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 8; j++) MMA(acc[i][j], af[i], (&bf[j / 2][(j % 2) * 2]));
        }
        uint4* dst = (uint4*)(sm + ((s + 1) % 2) * BUF);
        for (int c = threadIdx.x; c < CHUNKS; c += NT) {
            int row = c / (BK / 8), part = c % (BK / 8);
            dst[(row * LD + part * 8) / 8] = make_uint4(s, s + 1, 0, 0);
        }
        __syncthreads();
    }
    float t = 0;
    for (int i = 0; i < 4; i++) for (int j = 0; j < 8; j++) for (int e = 0; e < 4; e++) t += acc[i][j][e];
    out[blockIdx.x * NT + threadIdx.x] = t;
}

template <int BM, int BN, int BK, int MINB>
void run(float* out) {
    auto kern = k<BM, BN, BK, MINB>;
    constexpr int NT = (BM / 64) * (BN / 64) * 32;
    int smem = 2 * (BM + BN) * (BK + 8) * 2;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int tiles = (4096 / BM) * (4096 / BN), steps = 4096 / BK;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int w = 0; w < 2; w++) kern<<<tiles, NT, smem>>>(out, steps);
    cudaEventRecord(e0);
    for (int r = 0; r < 10; r++) kern<<<tiles, NT, smem>>>(out, steps);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    double us = ms * 100.0;
    int occ = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, NT, smem);
    cudaFuncAttributes fa; cudaFuncGetAttributes(&fa, kern);
    printf("%3dx%3dx%2d: %4d threads, smem %6d, %3d regs, %d blocks/SM: %7.1f us (%6.1f TFLOP/s)  %s\n", BM, BN, BK, NT, smem,
           fa.numRegs, occ, us, 2.0 * 4096.0 * 4096.0 * 4096.0 / us / 1e6, cudaGetErrorString(cudaGetLastError()));
}

int main() {
    float* out; cudaMalloc(&out, 1 << 26);
    run<256, 128, 16, 1>(out);
    run<256, 128, 32, 1>(out);
    run<256, 128, 64, 1>(out);
    run<128, 128, 16, 2>(out);
    run<128, 128, 32, 2>(out);
    run<128, 128, 64, 2>(out);
    run<128, 256, 32, 1>(out);
    return 0;
}

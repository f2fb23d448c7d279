// A measurement, not part of kiln (which never depends on CUDA): what NVIDIA's own path
// (mma.sync, ldmatrix) reaches in the shape of kiln's cooperative GEMM (wgsl/gemm_coop.wgsl),
// so that a gap is known to be the structure's or the Vulkan path's. On the GPU machine:
//   nvcc -O3 -arch=sm_90 -DSTRIDE=24 -o mma mma_skeleton.cu && ./mma   (H200 run 431-432)
// Microbenchmark: what mma.sync + ldmatrix reach on this GPU in kiln's GEMM structure
// (256x128 tile, 8 warps of 64x64, K steps of 16, padded rows of 24 halves), without global loads.
#include <cstdio>
#include <cuda_fp16.h>
#include <cstdint>

#define MMA(d, a, b) asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#define LDSM4(r, addr) asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" \
    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr))

constexpr int LD = STRIDE;             // halves per staged row
constexpr int BM = 256, BN = 128;
constexpr int ABUF = BM * LD, BBUF = BN * LD; // halves

template <int MODE>  // 0: registers only; 1: ldsm+mma; 2: +barrier; 3: +stores after the mma; 4: stores first; 5: stores between ldsm and mma
__global__ void __launch_bounds__(256, 1) k(float* out, int steps, int stages) {
    extern __shared__ __align__(16) half sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 2, wn = warp % 2;
    float acc[4][8][4] = {};
    uint32_t af[4][4], bf[4][4];
    for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) { af[i][j] = lane * 7 + i + j; bf[i][j] = lane * 3 + i * j; }
    for (int i = threadIdx.x; i < stages * (ABUF + BBUF); i += 256) sm[i] = __float2half(0.001f * (i % 13));
    __syncthreads();
    uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    for (int s = 0; s < steps; s++) {
        int buf = s % stages;
        uint32_t a0 = base + 2 * (buf * (ABUF + BBUF));
        uint32_t b0 = a0 + 2 * ABUF;
        auto stores = [&]() {
            int nb = (s + stages - 1) % stages;
            uint4* dst = (uint4*)(sm + nb * (ABUF + BBUF));
            for (int c = threadIdx.x; c < 768; c += 256) {
                int row = c / 2, part = c % 2;
                dst[(row * LD + part * 8) / 8] = make_uint4(s, s + 1, 0, 0);
            }
        };
        if (MODE == 4) stores();
        if (MODE >= 1) {
            for (int i = 0; i < 4; i++) {
                int row = wm * 64 + i * 16 + (lane % 16), col = (lane / 16) * 8;
                LDSM4(af[i], a0 + 2 * (row * LD + col));
            }
            for (int j = 0; j < 4; j++) {
                int row = wn * 64 + j * 16 + (lane % 8) + (lane / 16) * 8, col = ((lane / 8) % 2) * 8;
                LDSM4(bf[j], b0 + 2 * (row * LD + col));
            }
        }
        if (MODE == 5) stores();
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) MMA(acc[i][j], af[i], (&bf[j / 2][(j % 2) * 2]));
        if (MODE == 3) {
            int nb = (s + stages - 1) % stages;
            uint4* dst = (uint4*)(sm + nb * (ABUF + BBUF));
            // 3 16-byte stores a thread: 384 rows x 2 chunks of 8 halves = 768 chunks
            for (int c = threadIdx.x; c < 768; c += 256) {
                int row = c / 2, part = c % 2;
                dst[(row * LD + part * 8) / 8] = make_uint4(s, s + 1, 0, 0);
            }
        }
        if (MODE >= 2) __syncthreads();
    }
    float t = 0;
    for (int i = 0; i < 4; i++) for (int j = 0; j < 8; j++) for (int e = 0; e < 4; e++) t += acc[i][j][e];
    out[blockIdx.x * 256 + threadIdx.x] = t;
}

int main() {
    float* out; cudaMalloc(&out, 132 * 8 * 256 * 4);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    printf("SMs %d, clock %d MHz, row stride %d halves\n", sms, clk / 1000, LD);
    // 4096^3 as kiln runs it: 512 tiles of 256x128 = 4 waves on 132 SMs, 256 K steps each.
    const int steps = 1024;
    const double flop = 2.0 * 4096.0 * 4096.0 * 4096.0;
    auto run = [&](auto kern, const char* name, int stages) {
        int smem = stages * (ABUF + BBUF) * 2;
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        for (int w = 0; w < 2; w++) kern<<<sms, 256, smem>>>(out, steps, stages);
        cudaEventRecord(e0);
        for (int r = 0; r < 10; r++) kern<<<sms, 256, smem>>>(out, steps, stages);
        cudaEventRecord(e1); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        double us = ms * 1000.0 / 10;
        printf("%-44s stages %d smem %6d: %8.1f us  (%6.1f TFLOP/s at 4096^3 equiv)  err %s\n", name, stages, smem, us,
               flop / us / 1e6, cudaGetErrorString(cudaGetLastError()));
    };
    run(k<0>, "mma only, registers", 2);
    run(k<1>, "ldsm + mma", 2);
    run(k<2>, "ldsm + mma + barrier", 2);
    run(k<3>, "ldsm + mma + 3 STS.128 + barrier", 2);
    run(k<3>, "ldsm + mma + 3 STS.128 + barrier", 3);
    run(k<4>, "3 STS.128 + ldsm + mma + barrier", 2);
    run(k<5>, "ldsm + 3 STS.128 + mma + barrier", 2);
    return 0;
}

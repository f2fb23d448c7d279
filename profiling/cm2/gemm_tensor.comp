#version 450
// Workgroup-scope GEMM with tensor-addressed loads straight from the storage buffers (no
// workgroup memory), the form of llama.cpp's mul_mm_cm2.comp. Y[M,N] = X[M,K] * W[N,K]^T.
// The GLSL reference of kiln's src/kernels/gemm_cm2.rs (which writes its SPIR-V itself), for
// examples/coopmat2_lab.rs: build with glslang 15 or later (glslc of shaderc 2025, e.g. Debian
// trixie's glslc and glslang-tools), e.g.
//   glslc --target-env=vulkan1.3 -fshader-stage=compute -O -DWG=256 -DBM=128 -DBN=256 -DBK=64 \
//     -DUNROLL=2 -DGROUP=8 gemm_tensor.comp -o t.spv
// and run `LAB_SPV_IN=t.spv coopmat2_lab 4096 4096 4096 128 256 64 256` (the lab's bindings and
// parameters: m, n, k). H200 (runs 494-501): 515-548 µs at 4096^3 by the device's memory
// hints. Optional: -DGROUP=g (tile order), -DKCONST=k, -DNOUNROLL.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(binding = 0) uniform P { uint M; uint N; uint K; uint pad; } p;
layout(binding = 1) readonly buffer Wb { float16_t w[]; };
layout(binding = 2) readonly buffer Xb { float16_t x[]; };
layout(binding = 3) buffer Yb { float y[]; };

void main() {
#ifdef GROUP
    // tiles visited GROUP rows of tiles at a time, column by column
    uint tiles_n = p.N / BN;
    uint t = gl_WorkGroupID.y * tiles_n + gl_WorkGroupID.x;
    uint per = GROUP * tiles_n;
    uint g = t / per;
    uint r = t % per;
    uint ty = g * GROUP + r % GROUP;
    uint tx = r / GROUP;
#else
    uint ty = gl_WorkGroupID.y;
    uint tx = gl_WorkGroupID.x;
#endif
    uint m0 = ty * BM;
    uint n0 = tx * BN;
#ifdef KCONST
    const uint ks = KCONST;
#else
    uint ks = p.K & ~7u;
#endif
    tensorLayoutNV<2> tlX = createTensorLayoutNV(2);
    tensorLayoutNV<2> tlW = createTensorLayoutNV(2);
    tensorLayoutNV<2> tlY = createTensorLayoutNV(2);
    tlX = setTensorLayoutDimensionNV(tlX, p.M, ks);
    tlW = setTensorLayoutDimensionNV(tlW, p.N, ks);
    tlY = setTensorLayoutDimensionNV(tlY, p.M, p.N);
    tlX = setTensorLayoutStrideNV(tlX, ks, 1);
    tlW = setTensorLayoutStrideNV(tlW, ks, 1);
    tlY = setTensorLayoutStrideNV(tlY, p.N, 1);
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    uint k = 0;
#ifdef NOUNROLL
    [[dont_unroll]]
#endif
    for (uint i = 0; i < ks / (BK * UNROLL); ++i) {
        [[unroll]] for (uint j = 0; j < UNROLL; ++j) {
            coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
            coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
            coopMatLoadTensorNV(a, x, 0, sliceTensorLayoutNV(tlX, m0, BM, k, BK));
            coopMatLoadTensorNV(b, w, 0, sliceTensorLayoutNV(tlW, n0, BN, k, BK), tr);
            acc = coopMatMulAdd(a, b, acc);
            k += BK;
        }
    }
    coopMatStoreTensorNV(acc, y, 0, sliceTensorLayoutNV(tlY, m0, BM, n0, BN));
}

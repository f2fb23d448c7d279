//! GEMV and GEMM for every weight format against the CPU reference, on ragged shapes, with
//! and without subgroups, and on tensors split across bindings. The runners and references
//! are `kiln::doctor`'s (what `kiln doctor` runs on a user's GPU).
//! Tolerance: max |Δ| <= 2e-5 x max |y| (f32 accumulation of exact dequantized weights,
//! against an f64 reference).

mod common;

use common::*;
use kiln::doctor::checks::{qkv_shapes, qkv_v_part_shape, COOP_EPILOGUE_TOL, Q8_EPILOGUE_TOL};
use kiln::doctor::data::{k_for, k_for_coop, q8_exact_x, MatmulCase};
use kiln::doctor::matmul::{self as mm, coop_bound, q8_bound, Epi, Input, Run};
use kiln::gpu::{run_dispatches, GpuContext, WeightTensor};
use kiln::kernels::matmul::{self, Matmul};
use kiln::plan::{
    GemmTile, GemvShape, MatmulKernel, GEMV_GROUP_COLS, GEMV_Q8_GROUP_COLS, GEMV_Q8_SWIGLU, GEMV_Q8_WIDE,
    GEMV_Q8_WIDE_FEW_ROWS,
};
use kiln::quant::WeightFormat;

const TOL: f32 = 2e-5;

/// Tolerance of a fused epilogue's outputs on `kernel`: f32 accumulation of exact weights;
/// int8 activations round x; cooperative matrices round x and W to f16 (2^-11 each, summed
/// over k = 256 products).
fn epilogue_tol(kernel: MatmulKernel) -> f32 {
    match kernel {
        MatmulKernel::Gemv { q8: true, .. } => Q8_EPILOGUE_TOL,
        MatmulKernel::Gemm { tile } if tile.is_coop() => COOP_EPILOGUE_TOL,
        _ => TOL * 4.0,
    }
}

fn case(format: WeightFormat, n: usize, k: usize, m: usize, seed: u64) -> MatmulCase {
    MatmulCase::new(format, n, k, m, seed).expect("case")
}

/// A matmul's GPU result against its CPU reference at TOL.
fn assert_exact(what: &str, (got, want, _): (Vec<f32>, Vec<f32>, MatmulCase)) {
    assert_close(what, &got, &want, TOL);
}

/// Runs `run` over `c`: its one output (GPU, reference) and the activations multiplied.
fn run_one(ctx: &GpuContext, c: &MatmulCase, run: &Run) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let out = mm::run(ctx, c, run).expect("matmul");
    let y = out.outputs.into_iter().next().expect("an output");
    (y.got, y.want, out.input)
}

/// Runs one matmul: (GPU result, CPU reference, the case); `x` ([m, k]) replaces the case's
/// Gaussian activations when given.
#[allow(clippy::too_many_arguments)]
fn run_matmul(
    ctx: &GpuContext,
    format: WeightFormat,
    n: usize,
    k: usize,
    m: usize,
    kernel: MatmulKernel,
    bias: bool,
    accumulate: bool,
    x: Option<Vec<f32>>,
) -> (Vec<f32>, Vec<f32>, MatmulCase) {
    let mut c = case(format, n, k, m, (n * 31 + k * 7 + m) as u64);
    if let Some(x) = x {
        c.x = x;
    }
    let (got, want, _) = run_one(ctx, &c, &Run::plain(kernel, bias, accumulate));
    (got, want, c)
}

#[test]
fn gemv_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL {
            for (m, shape) in [
                (1, GemvShape::new(64, 4)),
                (2, GemvShape::new(32, 4)),
                (3, GemvShape::new(256, 2)),
                (8, GemvShape::new(128, 2)),
                // Three groups of 8 columns (workgroup_id.z), the last ragged.
                (19, GemvShape::new(64, 4)),
                // One column on 4 groups of 16 invocations, each its own 2 rows: 8 rows a
                // workgroup, the last of 37 ragged.
                (1, GemvShape::grouped(64, 2, 4)),
            ] {
                // Float rows of 171 weights take the loop with bounds checks, rows of 176 (k % 8
                // == 0, as every model's) the one without; block formats whole blocks.
                let ks = [k_for(format, 3, 171), k_for(format, 3, 176)];
                for k in if ks[0] == ks[1] { &ks[..1] } else { &ks[..] } {
                    let (n, k) = (37, *k);
                    let kernel = MatmulKernel::Gemv { ncols: m.min(GEMV_GROUP_COLS), shape, q8: false };
                    let what = format!("[{}] gemv {} n={n} k={k} m={m}", g.name, format.name());
                    let grouped = shape.groups > 1;
                    let (bias, accumulate) = (m == 3 || grouped, m >= 8 || grouped);
                    assert_exact(&what, run_matmul(&g.ctx, format, n, k, m as usize, kernel, bias, accumulate, None));
                }
            }
        }
    }
}

#[test]
fn gemm_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL {
            for (m, n, tile) in [
                (9usize, 45usize, GemmTile::T32),
                (70, 130, GemmTile::T64),
                (70, 130, GemmTile::T128x64),
                (70, 130, GemmTile::T128),
                (70, 130, GemmTile::T64x128),
            ] {
                let k = k_for(format, 2, 100);
                let kernel = MatmulKernel::Gemm { tile };
                let what = format!("[{}] gemm {} m={m} n={n} k={k} {tile:?}", g.name, format.name());
                assert_exact(&what, run_matmul(&g.ctx, format, n, k, m, kernel, m == 9, m == 70, None));
            }
        }
    }
}

/// The cooperative-matrix GEMM (prefill on matrix cores) on every adapter that offers 16x16
/// f16 tiles, for every format it is planned for, ragged shapes included, with bias and
/// residual add, within the bound of rounding activations and weights to f16
/// (`doctor::matmul::coop_bound`). Adapters without them (lavapipe, GL) print that they skip
/// it; the H200 runs it.
#[test]
fn gemm_coop_every_format() {
    for g in gpus() {
        if !g.ctx.caps.coopmat {
            eprintln!("[{}] no 16x16x16 f16 cooperative matrices: gemm_coop not run on this adapter", g.name);
            continue;
        }
        for format in WeightFormat::ALL.into_iter().filter(|f| !matches!(f, WeightFormat::F32 | WeightFormat::BF16)) {
            // K from a number of blocks (ragged for F16), or as given: 512 takes F16 through
            // whole tiles too, several of them at 256x128 before the edge ones.
            let shapes = GemmTile::COOP.into_iter().flat_map(|tile| {
                [
                    (70usize, 130usize, Err(2usize), tile),
                    (64, 64, Err(1), tile),
                    (9, 45, Err(3), tile),
                    (200, 70, Err(2), tile),
                    (300, 200, Err(5), tile),
                    (520, 260, Ok(512usize), tile),
                ]
            });
            for (m, n, k, tile) in shapes {
                let kernel = MatmulKernel::Gemm { tile };
                let k = k.unwrap_or_else(|blocks| k_for_coop(format, blocks));
                let what = format!("[{}] gemm_coop {} m={m} n={n} k={k} {tile:?}", g.name, format.name());
                let (got, want, c) = run_matmul(&g.ctx, format, n, k, m, kernel, m % 64 != 0, m % 10 == 0, None);
                assert_within(&what, &got, &want, &coop_bound(&c.w_ref, n, k, &c.x, m), TOL);
            }
        }
    }
}

/// The workgroup-scope GEMM (VK_NV_cooperative_matrix2 with tensor-addressed loads,
/// kernels/gemm_cm2.rs) where the device was opened with it (NVIDIA's Vulkan driver; elsewhere
/// the test prints that it skips): whole tiles, in one band of tile rows, in bands of
/// `gemm_cm2::GROUP` rows with a shorter last one, several K loop iterations, plain and with the
/// residual add; a matmul with a bias (which it has no epilogue for) refused; and the planner
/// taking it for a large F16 GEMM.
#[test]
fn gemm_cm2_matches_reference() {
    for g in gpus() {
        if !g.ctx.caps.cm2 {
            eprintln!("[{}] no workgroup-scope cooperative matrices: gemm_cm2 not run on this adapter", g.name);
            continue;
        }
        let kernel = MatmulKernel::Gemm { tile: GemmTile::Cm2 };
        for (m, n, k, accumulate) in [
            (128usize, 256usize, 128usize, false),
            (384, 512, 256, true),
            (1280, 512, 384, true),
            (256, 768, 640, false),
        ] {
            let what = format!("[{}] gemm_cm2 m={m} n={n} k={k} accumulate={accumulate}", g.name);
            let (got, want, c) = run_matmul(&g.ctx, WeightFormat::F16, n, k, m, kernel, false, accumulate, None);
            assert_within(&what, &got, &want, &coop_bound(&c.w_ref, n, k, &c.x, m), TOL);
        }
        let c = case(WeightFormat::F16, 256, 128, 128, 1);
        assert!(mm::run(&g.ctx, &c, &Run::plain(kernel, true, false)).is_err(), "a bias on gemm_cm2");
        let planned = kiln::plan::plan_gemm(4096, 4096, 4096, WeightFormat::F16, &g.ctx.caps);
        assert_eq!(planned, kernel, "the planner's F16 GEMM at 4096^3");
    }
}

/// Split-K: a GEMM over K ranges (workgroup_id.z) writing partial sums, added up by a second
/// pass through the epilogue, matches the reference: 2, 3 and more ranges than K has steps
/// (capped), ragged K ranges, bias and residual add, and the fused SwiGLU and Q/K/V epilogues
/// applied by the second pass; on the float GEMM everywhere and on cooperative matrices where
/// the adapter has them.
#[test]
fn split_k_gemm_matches_reference() {
    for g in gpus() {
        let mut tiles = vec![GemmTile::T32];
        if g.ctx.caps.coopmat {
            tiles.push(GemmTile::Coop16);
            tiles.push(GemmTile::Coop64);
            tiles.push(GemmTile::Coop128);
            tiles.push(GemmTile::Coop256x128);
        }
        for tile in tiles {
            let kernel = MatmulKernel::Gemm { tile };
            let coop = tile.is_coop();
            for format in [WeightFormat::Q4K, WeightFormat::Q8_0, WeightFormat::F16] {
                // Float k in whole 8-value chunks (the cooperative GEMM's F16 rows), ragged
                // against the K steps.
                for (m, n, blocks, float_k) in [(9usize, 45usize, 3usize, 104usize), (70, 130, 5, 296)] {
                    let k = k_for(format, blocks, float_k);
                    for splits in [2u32, 3, 64] {
                        let what =
                            format!("[{}] split-K {splits} {tile:?} {} m={m} n={n} k={k}", g.name, format.name());
                        let c = case(format, n, k, m, (m * 7 + n + splits as usize) as u64);
                        let run = Run { splits, ..Run::plain(kernel, true, true) };
                        let (got, want, x) = run_one(&g.ctx, &c, &run);
                        if coop {
                            assert_within(&what, &got, &want, &coop_bound(&c.w_ref, n, k, &x, m), TOL);
                        } else {
                            assert_close(&what, &got, &want, TOL);
                        }
                    }
                }
            }
            // The fused epilogues, applied by the second pass.
            let (k, m) = (512, 13);
            let mut epis = vec![(Epi::SwiGlu, 66)];
            epis.extend(qkv_shapes(g.ctx.caps.f16).into_iter().take(2).map(|s| (Epi::Qkv(s), s.rows())));
            for (epi, n) in epis {
                let c = case(WeightFormat::Q4K, n, k, m, (m * 13 + n) as u64);
                let run =
                    Run { kernel, bias: true, accumulate: false, input: Input::Plain, epi, splits: 3, dequant: false };
                for o in mm::run(&g.ctx, &c, &run).unwrap().outputs {
                    let what = format!("[{}] split-K 3 {tile:?} {epi:?} {}", g.name, o.what);
                    let tol = epilogue_tol(kernel);
                    assert_close(&what, &o.got, &o.want, if o.f16 { tol.max(1e-3) } else { tol });
                }
            }
        }
    }
}

#[test]
fn planner_choice_runs_for_decode_and_prefill() {
    let g = &gpus()[0];
    for m in [1usize, 5, 40] {
        let (n, k) = (64, 256);
        let c = case(WeightFormat::Q4K, n, k, m, 99);
        let w = WeightTensor::upload(&g.ctx, "w", WeightFormat::Q4K, n, k, &c.weights).unwrap();
        let x = g.ctx.upload_f32(&c.x, "x").unwrap();
        let y = g.ctx.storage((m * n * 4) as u64, "y").unwrap();
        let mm = Matmul::dense(&w, &x, &y, m as u32);
        let ds = matmul::prepare(&g.ctx, &mm, "test").unwrap();
        run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
        let got = g.ctx.read_f32(&y, m * n).unwrap();
        let want = matmul::reference(&c.w_ref, n, k, &c.x, m, None, None);
        let planned = kiln::plan::plan_matmul(m as u32, n as u32, k as u32, WeightFormat::Q4K, &g.ctx.caps);
        if let MatmulKernel::Gemv { q8: true, .. } = planned {
            assert_within(&format!("planned m={m} {planned}"), &got, &want, &q8_bound(&c.w_ref, n, k, &c.x, m), TOL);
        } else {
            assert_close(&format!("planned m={m} {planned}"), &got, &want, TOL);
        }
    }
}

/// A binding limit of 4 KiB splits every test tensor into several chunks.
#[test]
fn split_tensors_match_unsplit_results() {
    let ctx = small_binding_gpu(4096);
    for format in [WeightFormat::F32, WeightFormat::Q8_0, WeightFormat::Q4K, WeightFormat::Q6K] {
        let k = k_for(format, 2, 96);
        let n = 120;
        let c = case(format, n, k, 1, 5);
        let w = WeightTensor::upload(&ctx, "w", format, n, k, &c.weights).unwrap();
        assert!(w.chunks.len() > 1, "{} should be split, got {} chunk", format.name(), w.chunks.len());
        for kernel in [
            MatmulKernel::Gemv { ncols: 1, shape: GemvShape::new(64, 4), q8: false },
            MatmulKernel::Gemm { tile: GemmTile::T32 },
        ] {
            let m = if matches!(kernel, MatmulKernel::Gemm { .. }) { 20 } else { 1 };
            let what = format!("split {} {kernel}", format.name());
            assert_exact(&what, run_matmul(&ctx, format, n, k, m, kernel, true, false, None));
        }
    }
}

/// A GEMV with a fused input: the kernel at 64 invocations on 4 rows over m columns (in
/// groups of a workgroup's columns where m has more).
fn gemv(m: usize, q8: bool) -> MatmulKernel {
    let group = if q8 { GEMV_Q8_GROUP_COLS } else { GEMV_GROUP_COLS };
    MatmulKernel::Gemv { ncols: (m as u32).min(group), shape: GemvShape::new(64, 4), q8 }
}

/// GEMV with the RMSNorm of x fused in front equals RMSNorm then GEMV.
#[test]
fn gemv_with_fused_rms_norm() {
    for g in gpus() {
        // Float rows of 96 weights (k % 8 == 0) and, for F16, 92: both one-column loops.
        for (format, ragged) in [
            (WeightFormat::F32, 96),
            (WeightFormat::F16, 92),
            (WeightFormat::Q8_0, 0),
            (WeightFormat::Q4K, 0),
            (WeightFormat::Q6K, 0),
        ] {
            let (n, k) = (45usize, k_for(format, 2, ragged));
            // m = 1 also on row groups (4 of 32 invocations, 4 rows each), as decode runs it.
            let grouped = MatmulKernel::Gemv { ncols: 1, shape: GemvShape::grouped(128, 4, 4), q8: false };
            for (m, kernel) in [(1usize, gemv(1, false)), (3, gemv(3, false)), (10, gemv(10, false)), (1, grouped)] {
                let c = case(format, n, k, m, 77);
                let input = Input::Norm { gamma: randn(&mut rng(5), k, 1.0), eps: 1e-5 };
                let run = Run { input, ..Run::plain(kernel, false, false) };
                let (got, want, _) = run_one(&g.ctx, &c, &run);
                assert_close(&format!("[{}] gemv+norm {} m={m} {kernel}", g.name, format.name()), &got, &want, TOL);
            }
        }
    }
}

/// GEMV with silu(gate) * up fused in front equals SiLU·mul then GEMV.
#[test]
fn gemv_with_fused_swiglu() {
    for g in gpus() {
        // F16 rows of 104 weights: the one-column loop without bounds checks (k % 8 == 0).
        for (format, ragged) in
            [(WeightFormat::F32, 100), (WeightFormat::F16, 104), (WeightFormat::Q4K, 0), (WeightFormat::Q6K, 0)]
        {
            let (n, k) = (33usize, k_for(format, 2, ragged));
            for m in [1usize, 2] {
                let c = case(format, n, k, m, 91);
                let input = Input::Glu { up: randn(&mut rng(8), m * k, 1.0) };
                let run = Run { input, ..Run::plain(gemv(m, false), false, false) };
                let (got, want, _) = run_one(&g.ctx, &c, &run);
                assert_close(&format!("[{}] gemv+swiglu {} m={m}", g.name, format.name()), &got, &want, TOL);
            }
        }
    }
}

/// The int8-activation GEMV for every quantized format, launch shape and column count:
/// exact on activations it quantizes without error, within the rounding bound otherwise.
#[test]
fn gemv_q8_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL.into_iter().filter(|f| f.is_quantized()) {
            for (m, ncols, shape) in [
                (1, 1, GemvShape::new(64, 4)),
                (2, 2, GemvShape::new(32, 4)),
                (3, 3, GemvShape::new(64, 2)),
                (4, 4, GemvShape::new(64, 4)),
                // Three groups of 4 columns (workgroup_id.z), the last ragged.
                (11, GEMV_Q8_GROUP_COLS, GemvShape::new(128, 2)),
                // Grouped shapes (groups of invocations each their own rows): the planner's
                // (4 groups of 32 invocations, 2 rows each) over two groups of 8 columns, the
                // last ragged; 8 groups of 8 over 8 columns. 37 rows leave the last workgroup's
                // groups partly or wholly past the matrix.
                (11, 8, GEMV_Q8_WIDE),
                (8, 8, GemvShape::grouped(64, 2, 8)),
                // The planner's shape for matrices of few rows (2 groups of 64), 5 columns.
                (5, 5, GEMV_Q8_WIDE_FEW_ROWS),
            ] {
                // Several x tiles for the 32-invocation shape, a ragged last one; for the
                // grouped shapes, units that do not divide among a group's invocations.
                let k = if format == WeightFormat::Q8_0 { 32 * 75 } else { 256 * 11 };
                let n = 37;
                let kernel = MatmulKernel::Gemv { ncols, shape, q8: true };
                let x = q8_exact_x(m as usize, k, 11 + m as u64);
                let what = format!("[{}] gemv_q8 {} n={n} k={k} m={m}", g.name, format.name());
                assert_exact(
                    &what,
                    run_matmul(&g.ctx, format, n, k, m as usize, kernel, m == 3 || m == 8, m == 4 || m == 11, Some(x)),
                );

                // Normal activations: within the bound of x's rounding.
                let c = case(format, n, k, m as usize, 5 + m as u64);
                let (got, want, _) = run_one(&g.ctx, &c, &Run::plain(kernel, false, false));
                let bound = q8_bound(&c.w_ref, n, k, &c.x, m as usize);
                assert_within(&format!("{what} randn"), &got, &want, &bound, TOL);
            }
        }
    }
}

/// The int8 GEMV with RMSNorm or SwiGLU fused in front, and on a tensor split across bindings.
#[test]
fn gemv_q8_fused_and_split() {
    for g in gpus() {
        for format in [WeightFormat::Q8_0, WeightFormat::Q4K, WeightFormat::Q5K, WeightFormat::Q6K] {
            let (n, k) = (45usize, k_for(format, 2, 0));
            for m in [1usize, 3, 6] {
                let c = case(format, n, k, m, 78);
                let inputs = [
                    ("norm", Input::Norm { gamma: randn(&mut rng(5), k, 1.0), eps: 1e-5 }),
                    ("swiglu", Input::Glu { up: randn(&mut rng(8), m * k, 1.0) }),
                ];
                for (fused, input) in inputs {
                    let run = Run { input, ..Run::plain(gemv(m, true), false, false) };
                    let (got, want, x) = run_one(&g.ctx, &c, &run);
                    let what = format!("[{}] gemv_q8+{fused} {} m={m}", g.name, format.name());
                    assert_within(&what, &got, &want, &q8_bound(&c.w_ref, n, k, &x, m), TOL);
                }
            }
        }
    }
    let ctx = small_binding_gpu(4096);
    for format in [WeightFormat::Q8_0, WeightFormat::Q4K, WeightFormat::Q6K] {
        let (n, k) = (120, k_for(format, 2, 0));
        let x = q8_exact_x(1, k, 3);
        let w_chunks =
            WeightTensor::upload(&ctx, "w", format, n, k, &case(format, n, k, 1, 5).weights).unwrap().chunks.len();
        assert!(w_chunks > 1, "{} should be split", format.name());
        let what = format!("split gemv_q8 {}", format.name());
        assert_exact(&what, run_matmul(&ctx, format, n, k, 1, gemv(1, true), true, false, Some(x)));
    }
}

/// One token's int8 GEMV input quantized 8 invocations a block with the RMSNorm's 1 / rms left
/// to the GEMV (`Caps::quantize_lanes`, quantize_q8_lanes.wgsl, common/q8_in_global.wgsl, on
/// adapters with subgroups), and with it turned off (quantize_q8.wgsl's blocks): through the
/// RMSNorm, through SwiGLU and as it is, within the bound of x's rounding; one workgroup's
/// 256 values, a second workgroup of 32, and many; 3 columns take quantize_q8.wgsl either
/// way. Through the float and grouped int8 shapes, so both reductions take the 1 / rms.
#[test]
fn lanes_quantizer_matches_reference() {
    for lanes in [true, false] {
        let opts = kiln::gpu::ContextOptions { quantize_lanes: Some(lanes), ..Default::default() };
        let ctx = std::sync::Arc::new(GpuContext::new(&opts).unwrap());
        if lanes && !ctx.caps.subgroups {
            eprintln!("{}: no subgroups, no quantize_q8_lanes", ctx.describe());
            continue;
        }
        assert_eq!(ctx.caps.quantize_lanes, lanes, "{:?}", ctx.caps);
        for (format, k, n) in
            [(WeightFormat::Q4K, 256usize, 45usize), (WeightFormat::Q8_0, 288, 34), (WeightFormat::Q4K, 2304, 6)]
        {
            for m in [1usize, 3] {
                // x's rms far from 1, so that a 1 / rms dropped shows.
                let mut c = case(format, n, k, m, (k + m) as u64);
                c.x.iter_mut().for_each(|v| *v *= 3.0);
                let inputs = [
                    ("norm", Input::Norm { gamma: randn(&mut rng(k as u64), k, 1.0), eps: 1e-5 }),
                    ("swiglu", Input::Glu { up: randn(&mut rng(k as u64 + 1), m * k, 1.0) }),
                    ("plain", Input::Plain),
                ];
                let grouped = MatmulKernel::Gemv { ncols: m as u32, shape: GemvShape::grouped(128, 2, 4), q8: true };
                for (fused, input) in inputs {
                    for kernel in [gemv(m, true), grouped] {
                        let run = Run { input: input.clone(), ..Run::plain(kernel, false, false) };
                        let (got, want, x) = run_one(&ctx, &c, &run);
                        let what = format!("{kernel} (lanes {lanes}) +{fused} {} k={k} m={m}", format.name());
                        assert_within(&what, &got, &want, &q8_bound(&c.w_ref, n, k, &x, m), TOL);
                    }
                }
            }
        }
    }
}

/// The fused epilogues against their CPU references, through every kernel kind that carries
/// them (float GEMV, int8 GEMV, register GEMM, cooperative GEMM where the adapter has it):
/// SwiGLU over interleaved gate/up rows, and the stacked Q/K/V projection (biases, NeoX row
/// order, partial rotation) whose epilogue rotates Q into Y and K into the cache and copies V
/// there, for tokens at positions 5.. of an f32 and an f16 cache; and for Q4_K, the
/// projection in two parts as Q4_K_M files give it (V's rows in Q6_K).
#[test]
fn fused_epilogues_match_reference() {
    let k = 256;
    for g in gpus() {
        let int8 = g.ctx.caps.int8_dot;
        for format in [WeightFormat::F32, WeightFormat::Q4K] {
            // Each kernel kind once (every variant compiles its own pipeline), with 2- and
            // 4-row GEMV workgroups and a 4x4 and 8x8 GEMM register tile.
            let gemv = |m: u32, wg: u32, rows: u32, q8: bool| MatmulKernel::Gemv {
                ncols: m,
                shape: GemvShape::new(wg, rows),
                q8,
            };
            let mut kernels: Vec<(&str, usize, MatmulKernel)> = vec![
                ("gemv m=1", 1, gemv(1, 64, 4, false)),
                ("gemv m=3", 3, gemv(3, 128, 2, false)),
                ("gemv groups of 8, m=11", 11, gemv(8, 64, 4, false)),
                (
                    "gemv row groups m=1",
                    1,
                    MatmulKernel::Gemv { ncols: 1, shape: GemvShape::grouped(128, 2, 4), q8: false },
                ),
                ("gemm m=13", 13, MatmulKernel::Gemm { tile: GemmTile::T32 }),
                ("gemm 128x64 m=70", 70, MatmulKernel::Gemm { tile: GemmTile::T128x64 }),
            ];
            if int8 && format != WeightFormat::F32 {
                kernels.push(("gemv_q8 m=2", 2, gemv(2, 128, 2, true)));
                kernels.push(("gemv_q8 groups of 4, m=6", 6, gemv(4, 128, 2, true)));
                let grouped = MatmulKernel::Gemv { ncols: 8, shape: GEMV_Q8_WIDE, q8: true };
                kernels.push(("gemv_q8 row groups, m=10", 10, grouped));
                // A large gate/up projection's one-token shape (`plan::GEMV_Q8_GLU_FLOAT`).
                let glu = MatmulKernel::Gemv { ncols: 1, shape: kiln::plan::GEMV_Q8_GLU_FLOAT, q8: true };
                kernels.push(("gemv_q8 row groups, m=1", 1, glu));
            }
            if g.ctx.caps.coopmat && format != WeightFormat::F32 {
                kernels.push(("gemm_coop m=70", 70, MatmulKernel::Gemm { tile: GemmTile::Coop64 }));
                kernels.push(("gemm_coop 256x128 m=270", 270, MatmulKernel::Gemm { tile: GemmTile::Coop256x128 }));
            }
            if int8 && format != WeightFormat::F32 {
                // The gate/up projection also writing the down projection's int8 input: 3
                // workgroups of 64 rows, at one column (decode) and three; `mm::run` checks
                // the blocks against the SwiGLU values the kernel wrote.
                for m in [1u32, 3] {
                    let kernel = MatmulKernel::Gemv { ncols: m, shape: GEMV_Q8_SWIGLU, q8: true };
                    let c = case(format, 192, k, m as usize, 7 + m as u64);
                    let run = Run { epi: Epi::SwiGluQ8, ..Run::plain(kernel, true, false) };
                    for o in mm::run(&g.ctx, &c, &run).unwrap().outputs {
                        let what = format!("[{}] {format} int8 SwiGLU epilogue m={m} {}", g.name, o.what);
                        assert_close(&what, &o.got, &o.want, epilogue_tol(kernel));
                    }
                    // Outputs that do not fill whole blocks are refused, not written half.
                    let c = case(format, 66, k, m as usize, 8);
                    let err = mm::run(&g.ctx, &c, &run).err().expect("66 rows are not whole int8 blocks");
                    assert!(err.to_string().contains("whole blocks of 32"), "{err}");
                }
                // One column through the RMSNorm, quantized by the quantize dispatch or
                // (`Caps::q8_swiglu_norm`) by each workgroup itself.
                let opts = kiln::gpu::ContextOptions { q8_swiglu_norm: Some(true), ..Default::default() };
                let local = std::sync::Arc::new(kiln::gpu::GpuContext::new(&opts).unwrap());
                assert!(local.caps.q8_swiglu_norm, "{:?}", local.caps);
                let kernel = MatmulKernel::Gemv { ncols: 1, shape: GEMV_Q8_SWIGLU, q8: true };
                let c = case(format, 192, k, 1, 9);
                let gamma = kiln::doctor::data::Rng::new(3).normal(k, 1.0);
                let input = Input::Norm { gamma, eps: 1e-5 };
                let run =
                    Run { kernel, bias: true, accumulate: false, input, epi: Epi::SwiGluQ8, splits: 1, dequant: false };
                for (ctx, how) in [(&g.ctx, "quantize dispatch"), (&local, "quantized in the workgroup")] {
                    let out = mm::run(ctx, &c, &run).unwrap();
                    for o in out.outputs {
                        let what = format!("[{}] {format} int8 SwiGLU epilogue +norm, {how}: {}", g.name, o.what);
                        assert_close(&what, &o.got, &o.want, epilogue_tol(kernel));
                    }
                }
                // A projection added to the residual stream also writing the next GEMV's int8
                // input through its RMSNorm (`Caps::q8_add_norm`): 3 workgroups of 32 rows,
                // with a bias, at one column; `mm::run` checks the blocks and their sums of
                // squares against the Y the kernel wrote. Rows that are not whole blocks are
                // refused.
                let opts = kiln::gpu::ContextOptions {
                    q8_add_norm: Some(Some(kiln::plan::GEMV_Q8_ADD_NORM)),
                    ..Default::default()
                };
                let add = std::sync::Arc::new(kiln::gpu::GpuContext::new(&opts).unwrap());
                if g.name == "native" && add.caps.q8_add_norm.is_some() {
                    let kernel = MatmulKernel::Gemv { ncols: 1, shape: kiln::plan::GEMV_Q8_ADD_NORM, q8: true };
                    let run = Run { epi: Epi::AddQ8Norm, ..Run::plain(kernel, true, true) };
                    for o in mm::run(&add, &case(format, 96, k, 1, 21), &run).unwrap().outputs {
                        let what = format!("[{}] {format} int8 residual epilogue: {}", g.name, o.what);
                        assert_close(&what, &o.got, &o.want, epilogue_tol(kernel));
                    }
                    let err =
                        mm::run(&add, &case(format, 80, k, 1, 22), &run).err().expect("80 rows are not whole blocks");
                    assert!(err.to_string().contains("whole blocks of 32"), "{err}");
                }
            }
            for (what, m, kernel) in kernels {
                let tol = epilogue_tol(kernel);
                let mut epis = vec![(Epi::SwiGlu, 66)];
                epis.extend(qkv_shapes(g.ctx.caps.f16).into_iter().map(|s| (Epi::Qkv(s), s.rows())));
                if format == WeightFormat::Q4K {
                    // Q4_K_M's layout: V's rows in Q6_K, a second part of the projection.
                    let s = qkv_v_part_shape(g.ctx.caps.f16);
                    epis.push((Epi::Qkv(s), s.rows()));
                }
                for (epi, n) in epis {
                    let c = case(format, n, k, m, (m * 13 + n) as u64);
                    let run = Run {
                        kernel,
                        bias: true,
                        accumulate: false,
                        input: Input::Plain,
                        epi,
                        splits: 1,
                        dequant: false,
                    };
                    for o in mm::run(&g.ctx, &c, &run).unwrap().outputs {
                        let what = format!("[{}] {format} {what} {epi:?} {}", g.name, o.what);
                        assert_close(&what, &o.got, &o.want, if o.f16 { tol.max(1e-3) } else { tol });
                    }
                }
            }
        }
    }
}

/// The gate/up GEMM writing its SwiGLU output as the down projection's f16 input (prefill on
/// cooperative GEMMs, `Caps::prefill_f16_inputs`): the halves against the reference, on the
/// float tiles (lavapipe) and the cooperative ones where the adapter has them, split along K
/// or not; outputs that are not whole rows of halves refused.
#[test]
fn swiglu_epilogue_writes_halves_for_the_next_gemm() {
    let k = 256;
    for g in gpus() {
        if !g.ctx.caps.f16 {
            continue;
        }
        let mut tiles = vec![(GemmTile::T32, 13usize)];
        if g.ctx.caps.coopmat {
            tiles.extend([(GemmTile::Coop64, 70), (GemmTile::Coop128, 140), (GemmTile::Coop256x128, 270)]);
        }
        for format in [WeightFormat::Q4K, WeightFormat::F16] {
            for &(tile, m) in &tiles {
                for splits in [1, 2] {
                    let kernel = MatmulKernel::Gemm { tile };
                    let c = case(format, 192, k, m, (m * 7 + splits as usize) as u64);
                    let run = Run {
                        kernel,
                        bias: true,
                        accumulate: false,
                        input: Input::Plain,
                        epi: Epi::SwiGluF16,
                        splits,
                        dequant: false,
                    };
                    for o in mm::run(&g.ctx, &c, &run).unwrap().outputs {
                        assert!(o.f16);
                        let what = format!("[{}] {format} {kernel} splits={splits} {}", g.name, o.what);
                        assert_close(&what, &o.got, &o.want, epilogue_tol(kernel).max(1e-3));
                    }
                }
            }
            let run = Run::plain(MatmulKernel::Gemm { tile: GemmTile::T32 }, true, false);
            let run = Run { epi: Epi::SwiGluF16, ..run };
            let err = mm::run(&g.ctx, &case(format, 66, k, 13, 5), &run).err().expect("33 outputs a row");
            assert!(err.to_string().contains("whole halves' rows"), "{err}");
        }
    }
}

/// The Q/K/V epilogue of a batched decode step on the GEMV: each column its own sequence (a
/// slot of a shared cache, in another order than the columns) at its own position, Q rotated
/// at that position into Y and K, V into that slot's region, for every cache kind and
/// rotation of `qkv_shapes` at 8 columns (the GEMV's most), the default at 3 (and through the
/// int8 GEMV where the adapter has it); and the single-sequence epilogue writing into a
/// region that does not start at row 0. The same on the GEMMs (several prompts prefilled
/// together: 20 rows, each its own position), split along K or not, on the float tiles and
/// on cooperative matrices where the adapter has them. Q4_K weights (the epilogue does not
/// depend on the format; every pipeline costs a compilation on lavapipe).
#[test]
fn batched_qkv_epilogue_writes_each_column_into_its_slot() {
    let (k, format) = (256, WeightFormat::Q4K);
    for g in gpus() {
        let gemv = |m: u32, q8: bool| MatmulKernel::Gemv { ncols: m, shape: GemvShape::new(64, 4), q8 };
        let shapes = qkv_shapes(g.ctx.caps.f16);
        let default = *shapes.last().unwrap();
        // (kernel, batched, shape, columns, K ranges)
        let mut runs: Vec<(MatmulKernel, bool, _, usize, u32)> =
            shapes.iter().map(|&s| (gemv(8, false), true, s, 8, 1)).collect();
        runs.push((gemv(3, false), true, default, 3, 1));
        runs.push((gemv(3, false), false, default, 3, 1));
        if g.ctx.caps.int8_dot {
            runs.push((gemv(3, true), true, default, 3, 1));
            let grouped = MatmulKernel::Gemv { ncols: 8, shape: GEMV_Q8_WIDE, q8: true };
            runs.push((grouped, true, default, 8, 1));
        }
        let mut tiles = vec![GemmTile::T32];
        if g.ctx.caps.coopmat {
            tiles.extend([GemmTile::Coop64, GemmTile::Coop128, GemmTile::Coop256x128]);
        }
        for tile in tiles {
            for splits in [1, 2] {
                runs.push((MatmulKernel::Gemm { tile }, true, default, 20, splits));
            }
        }
        for (kernel, batched, mut s, m, splits) in runs {
            let tol = epilogue_tol(kernel);
            s.kv_base = 7;
            s.batched = batched;
            let c = case(format, s.rows(), k, m, (m * 31 + s.rows()) as u64);
            let run = Run {
                kernel,
                bias: true,
                accumulate: false,
                input: Input::Plain,
                epi: Epi::Qkv(s),
                splits,
                dequant: false,
            };
            for o in mm::run(&g.ctx, &c, &run).unwrap().outputs {
                let what =
                    format!("[{}] {format} {kernel} splits={splits} batched={batched} {:?} {}", g.name, s.kv, o.what);
                assert_close(&what, &o.got, &o.want, if o.f16 { tol.max(1e-3) } else { tol });
            }
        }
    }
}

/// One GEMV dispatch over a Q/K/V projection stacked from two formats (decode's path for
/// Q4_K_M's and Q5_K_M's V in Q6_K, Q4_K_S's in Q5_K): Q, K and V against the CPU reference
/// for each pair of formats, through every one-column kernel the planner gives it (the float
/// GEMV through the RMSNorm, on the GPU's two-format shape too, the int8 GEMV after its
/// quantize dispatch where the adapter has it), with heads whose V rows are whole workgroups'
/// rows and heads whose V rows are not (18 or 24 of them: the second part's last workgroup
/// reads its last row again); a first part that is not whole workgroups' rows is refused.
#[test]
fn q_k_and_v_in_two_formats_take_one_dispatch() {
    let k = 256;
    let pairs = [
        (WeightFormat::Q4K, WeightFormat::Q6K),
        (WeightFormat::Q5K, WeightFormat::Q6K),
        (WeightFormat::Q4K, WeightFormat::Q5K),
    ];
    for g in gpus() {
        let mut kernels: Vec<MatmulKernel> = [
            GemvShape::new(128, 2),
            GemvShape::new(64, 4),
            kiln::plan::GEMV_FLOAT_MANY_ROWS_SHAPE,
            kiln::plan::GEMV_TWO_FORMATS_FLOAT_SHAPE,
        ]
        .into_iter()
        .map(|shape| MatmulKernel::Gemv { ncols: 1, shape, q8: false })
        .collect();
        if g.ctx.caps.int8_dot {
            kernels.extend([GemvShape::new(64, 4), GemvShape::new(128, 2)].map(|shape| MatmulKernel::Gemv {
                ncols: 1,
                shape,
                q8: true,
            }));
        }
        let default = qkv_v_part_shape(g.ctx.caps.f16);
        // (query heads, head dimension): V rows 128 (whole), 24 (not whole 16-row workgroups),
        // 18 (not whole 4-row ones); first parts of 384, 240 and 144 rows.
        let heads = [(4, 64), (9, 24), (7, 18)];
        for (i, &(first, second)) in pairs.iter().enumerate() {
            for (j, &kernel) in kernels.iter().enumerate() {
                let (n_head, head_dim) = heads[(i + j) % heads.len()];
                let s = kiln::doctor::matmul::QkvShape {
                    n_head,
                    n_kv_head: if head_dim == 64 { 2 } else { 1 },
                    head_dim,
                    n_rot: head_dim,
                    v_format: Some(second),
                    one_dispatch: true,
                    ..default
                };
                let c = case(first, s.rows(), k, 1, (i * 7 + j) as u64);
                let gamma = kiln::doctor::data::Rng::new(j as u64).normal(k, 1.0);
                let input = Input::Norm { gamma, eps: 1e-5 };
                let run =
                    Run { kernel, bias: true, accumulate: false, input, epi: Epi::Qkv(s), splits: 1, dequant: false };
                let tol = epilogue_tol(kernel);
                for o in mm::run(&g.ctx, &c, &run).unwrap().outputs {
                    let what = format!("[{}] {first}+{second} {kernel} heads {n_head}x{head_dim}: {}", g.name, o.what);
                    assert_close(&what, &o.got, &o.want, if o.f16 { tol.max(1e-3) } else { tol });
                }
            }
        }
        // 126 first rows: not whole 4-row workgroups.
        let s = kiln::doctor::matmul::QkvShape {
            n_head: 6,
            n_kv_head: 1,
            head_dim: 18,
            n_rot: 18,
            one_dispatch: true,
            ..default
        };
        let kernel = MatmulKernel::Gemv { ncols: 1, shape: GemvShape::new(64, 4), q8: false };
        let run = Run {
            kernel,
            bias: false,
            accumulate: false,
            input: Input::Plain,
            epi: Epi::Qkv(s),
            splits: 1,
            dequant: false,
        };
        let err = mm::run(&g.ctx, &case(WeightFormat::Q4K, s.rows(), k, 1, 3), &run).err().expect("126 rows");
        assert!(err.to_string().contains("whole workgroups' rows"), "{err}");
    }
}

/// Prefill's route over block-format weights (`Caps::dequant_f16_from`): the decoder's halves
/// are the CPU dequantizer's values rounded to f16, bit for bit, for every K-quant format; and
/// the GEMM over the copy (the planner's for F16 weights: the float tiles on lavapipe, the
/// cooperative ones where the adapter has them) matches the reference within the bound of
/// rounding W (and on cooperative matrices X) to f16: ragged shapes, bias and residual add,
/// and the SwiGLU and Q/K/V epilogues.
#[test]
fn gemm_over_an_f16_copy_of_block_weights() {
    let opts = kiln::gpu::ContextOptions { dequant_f16_from: Some(Some(1)), ..Default::default() };
    let ctx = GpuContext::new(&opts).unwrap();
    if ctx.caps.dequant_f16_from.is_none() {
        eprintln!("{}: no SHADER_F16, no f16 copy of the weights", ctx.describe());
        return;
    }
    let tol = epilogue_tol(MatmulKernel::Gemm { tile: GemmTile::Coop128 });
    // (Q8_0's copies are only resident ones: the decoder alone.)
    for format in WeightFormat::ALL.into_iter().filter(|&f| kiln::plan::resident_f16_format(f)) {
        // The decoder alone: 38 rows of 3 blocks. (Odd row counts are uploaded in two chunks,
        // which the route leaves to the GEMM's own decoding.)
        let c = case(format, 38, k_for_coop(format, 3), 1, 5);
        let w = WeightTensor::upload(&ctx, "w", format, c.n, c.k, &c.weights).unwrap();
        let halves = ctx.storage((c.n * c.k * 2) as u64, "halves").unwrap();
        let d = matmul::prepare_dequant_f16(&ctx, &w, &halves).unwrap();
        run_dispatches(&ctx, &[&d]).unwrap();
        let bytes = ctx.read_bytes(&halves, 0, (c.n * c.k * 2) as u64).unwrap();
        for (i, (b, want)) in bytes.chunks_exact(2).zip(&c.w_ref).enumerate() {
            let (got, want) = (u16::from_le_bytes([b[0], b[1]]), half::f16::from_f32(*want).to_bits());
            assert_eq!(got, want, "{format}: weight {i} of {}x{} decoded to f16", c.n, c.k);
        }
        if !kiln::plan::dequant_f16_format(format) {
            continue;
        }
        // The GEMMs over the copy.
        for (m, n, blocks) in [(9usize, 46usize, 2usize), (70, 130, 1), (300, 200, 3)] {
            let k = k_for_coop(format, blocks);
            let c = case(format, n, k, m, (m * 7 + n) as u64);
            let run = Run { dequant: true, ..Run::plain(MatmulKernel::Gemm { tile: GemmTile::T32 }, m != 70, m != 9) };
            let (got, want, _) = run_one(&ctx, &c, &run);
            let what = format!("{format} over an f16 copy, m={m} n={n} k={k}");
            assert_within(&what, &got, &want, &coop_bound(&c.w_ref, n, k, &c.x, m), TOL);
        }
        let m = 70;
        let mut epis = vec![(Epi::SwiGlu, 66)];
        epis.extend(qkv_shapes(ctx.caps.f16).into_iter().map(|s| (Epi::Qkv(s), s.rows())));
        for (epi, n) in epis {
            let c = case(format, n, 256, m, (m * 13 + n) as u64);
            let run = Run { epi, dequant: true, ..Run::plain(MatmulKernel::Gemm { tile: GemmTile::T32 }, true, false) };
            for o in mm::run(&ctx, &c, &run).unwrap().outputs {
                let what = format!("{format} over an f16 copy, {epi:?} {}", o.what);
                assert_close(&what, &o.got, &o.want, if o.f16 { tol.max(1e-3) } else { tol });
            }
        }
    }
}

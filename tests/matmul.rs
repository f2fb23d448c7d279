//! GEMV and GEMM for every weight format against the CPU reference, on ragged shapes, with
//! and without subgroups, and on tensors split across bindings.
//! Tolerance: max |Δ| <= 2e-5 x max |y| (f32 accumulation of exact dequantized weights,
//! against an f64 reference).

mod common;

use common::*;
use kiln::gpu::{run_dispatches, GpuContext, WeightTensor};
use kiln::kernels::matmul::{self, Epilogue, Matmul, RopeShape, StepState};
use kiln::kernels::KvKind;
use kiln::plan::{GemmTile, GemvShape, MatmulKernel};
use kiln::quant::{dequantize, quantize, WeightFormat};

const TOL: f32 = 2e-5;

/// Row length for a format: ragged for float formats, whole blocks otherwise.
fn k_for(format: WeightFormat, blocks: usize, ragged: usize) -> usize {
    if format.block_elems() == 1 {
        ragged
    } else {
        format.block_elems() * blocks
    }
}

struct Case {
    weights: Vec<u8>,
    w_ref: Vec<f32>,
    x: Vec<f32>,
    bias: Vec<f32>,
    y0: Vec<f32>,
}

fn case(format: WeightFormat, n: usize, k: usize, m: usize, seed: u64) -> Case {
    let mut r = rng(seed);
    let w = randn(&mut r, n * k, 0.5);
    let weights = quantize(format, &w).expect("quantize");
    let mut w_ref = vec![0f32; n * k];
    dequantize(format, &weights, n * k, &mut w_ref).expect("dequantize");
    Case { weights, w_ref, x: randn(&mut r, m * k, 1.0), bias: randn(&mut r, n, 1.0), y0: randn(&mut r, m * n, 1.0) }
}

/// A matmul's GPU result against its CPU reference at TOL.
fn assert_exact(what: &str, (got, want, _): (Vec<f32>, Vec<f32>, Case)) {
    assert_close(what, &got, &want, TOL);
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
) -> (Vec<f32>, Vec<f32>, Case) {
    let mut c = case(format, n, k, m, (n * 31 + k * 7 + m) as u64);
    if let Some(x) = x {
        c.x = x;
    }
    // Activation rows padded to a multiple of 4 floats, as the engine lays them out.
    let xs = k.div_ceil(4) * 4;
    let mut xp = vec![0f32; m * xs];
    for i in 0..m {
        xp[i * xs..i * xs + k].copy_from_slice(&c.x[i * k..(i + 1) * k]);
    }
    let w = WeightTensor::upload(ctx, "w", format, n, k, &c.weights).expect("upload");
    let x = ctx.upload_f32(&xp, "x").unwrap();
    let y = ctx.upload_f32(&c.y0, "y").unwrap();
    let b = ctx.upload_f32(&c.bias, "bias").unwrap();
    let mm = Matmul {
        w: &w,
        x: &x,
        y: &y,
        bias: if bias { Some(&b) } else { None },
        m: m as u32,
        x_stride: xs as u32,
        y_stride: n as u32,
        accumulate,
        norm: None,
        glu: None,
        epi: Epilogue::Plain,
    };
    let ds = matmul::prepare_with(ctx, &mm, kernel, "test").expect("prepare");
    run_dispatches(ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
    let got = ctx.read_f32(&y, m * n).unwrap();
    let want = matmul::reference(&c.w_ref, n, k, &c.x, m, bias.then_some(&c.bias[..]), accumulate.then_some(&c.y0[..]));
    (got, want, c)
}

#[test]
fn gemv_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL {
            for (m, shape) in [
                (1, GemvShape { wg: 64, rows: 4 }),
                (2, GemvShape { wg: 32, rows: 4 }),
                (3, GemvShape { wg: 256, rows: 2 }),
                (8, GemvShape { wg: 128, rows: 2 }),
            ] {
                let k = k_for(format, 3, 171);
                let n = 37;
                let kernel = MatmulKernel::Gemv { ncols: m, shape, q8: false };
                let what = format!("[{}] gemv {} n={n} k={k} m={m}", g.name, format.name());
                assert_exact(&what, run_matmul(&g.ctx, format, n, k, m as usize, kernel, m == 3, m == 8, None));
            }
        }
    }
}

#[test]
fn gemm_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL {
            for (m, n, tile) in
                [(9usize, 45usize, GemmTile::T32), (70, 130, GemmTile::T128), (70, 130, GemmTile::T64x128)]
            {
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
/// residual add. Activations and weights are rounded to f16, so each element is held to
/// 2^-10 sum |w x| (two roundings of at most 2^-11 each), plus 2^-25 per value for f16's
/// subnormal range. Adapters without them (lavapipe, GL) print that they skip it; the H200
/// runs it.
#[test]
fn gemm_coop_every_format() {
    for g in gpus() {
        if !g.ctx.caps.coopmat {
            eprintln!("[{}] no 16x16x16 f16 cooperative matrices: gemm_coop not run on this adapter", g.name);
            continue;
        }
        for format in WeightFormat::ALL.into_iter().filter(|f| !matches!(f, WeightFormat::F32 | WeightFormat::BF16)) {
            for (m, n, blocks, tile) in [
                (70usize, 130usize, 2usize, GemmTile::Coop64),
                (64, 64, 1, GemmTile::Coop64),
                (9, 45, 3, GemmTile::Coop64),
                (200, 70, 2, GemmTile::Coop64),
            ] {
                let kernel = MatmulKernel::Gemm { tile };
                let k = k_for(format, blocks, 100 + 32 * blocks);
                let what = format!("[{}] gemm_coop {} m={m} n={n} k={k} {tile:?}", g.name, format.name());
                let (got, want, c) = run_matmul(&g.ctx, format, n, k, m, kernel, m % 64 != 0, m % 10 == 0, None);
                let bound: Vec<f32> = (0..m * n)
                    .map(|i| {
                        let (xr, wr) = (&c.x[(i / n) * k..][..k], &c.w_ref[(i % n) * k..][..k]);
                        xr.iter()
                            .zip(wr)
                            .map(|(a, b)| (a * b).abs() / 1024.0 + (a.abs() + b.abs()) / 33554432.0)
                            .sum::<f32>()
                            * 1.01
                    })
                    .collect();
                assert_within(&what, &got, &want, &bound);
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
            assert_within(&format!("planned m={m} {planned}"), &got, &want, &q8_bound(&c.w_ref, n, k, &c.x, m));
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
            MatmulKernel::Gemv { ncols: 1, shape: GemvShape { wg: 64, rows: 4 }, q8: false },
            MatmulKernel::Gemm { tile: GemmTile::T32 },
        ] {
            let m = if matches!(kernel, MatmulKernel::Gemm { .. }) { 20 } else { 1 };
            let what = format!("split {} {kernel}", format.name());
            assert_exact(&what, run_matmul(&ctx, format, n, k, m, kernel, true, false, None));
        }
    }
}

/// GEMV with the RMSNorm of x fused in front equals RMSNorm then GEMV.
#[test]
fn gemv_with_fused_rms_norm() {
    for g in gpus() {
        for format in [WeightFormat::F32, WeightFormat::Q8_0, WeightFormat::Q4K, WeightFormat::Q6K] {
            let (n, k) = (45usize, k_for(format, 2, 96));
            for m in [1usize, 3] {
                let c = case(format, n, k, m, 77);
                let w = WeightTensor::upload(&g.ctx, "w", format, n, k, &c.weights).unwrap();
                let gamma = randn(&mut rng(5), k, 1.0);
                let x = g.ctx.upload_f32(&c.x, "x").unwrap();
                let nw = g.ctx.upload_f32(&gamma, "norm").unwrap();
                let y = g.ctx.storage((m * n * 4) as u64, "y").unwrap();
                let mm = Matmul { norm: Some((&nw, 1e-5)), ..Matmul::dense(&w, &x, &y, m as u32) };
                let kernel = MatmulKernel::Gemv { ncols: m as u32, shape: GemvShape { wg: 64, rows: 4 }, q8: false };
                let ds = matmul::prepare_with(&g.ctx, &mm, kernel, "test").unwrap();
                run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                let got = g.ctx.read_f32(&y, m * n).unwrap();
                let xn = kiln::kernels::norm::reference(&c.x, &gamma, k, 1e-5);
                let want = matmul::reference(&c.w_ref, n, k, &xn, m, None, None);
                assert_close(&format!("[{}] gemv+norm {} m={m}", g.name, format.name()), &got, &want, TOL);
            }
        }
    }
}

/// GEMV with silu(gate) * up fused in front equals SiLU·mul then GEMV.
#[test]
fn gemv_with_fused_swiglu() {
    use kiln::kernels::elementwise::{self, EltOp};
    for g in gpus() {
        for format in [WeightFormat::F32, WeightFormat::Q4K, WeightFormat::Q6K] {
            let (n, k) = (33usize, k_for(format, 2, 100));
            for m in [1usize, 2] {
                let c = case(format, n, k, m, 91);
                let w = WeightTensor::upload(&g.ctx, "w", format, n, k, &c.weights).unwrap();
                let up = randn(&mut rng(8), m * k, 1.0);
                let (gb, ub) = (g.ctx.upload_f32(&c.x, "gate").unwrap(), g.ctx.upload_f32(&up, "up").unwrap());
                let y = g.ctx.storage((m * n * 4) as u64, "y").unwrap();
                let mm = Matmul { glu: Some(&ub), ..Matmul::dense(&w, &gb, &y, m as u32) };
                let kernel = MatmulKernel::Gemv { ncols: m as u32, shape: GemvShape { wg: 64, rows: 4 }, q8: false };
                let ds = matmul::prepare_with(&g.ctx, &mm, kernel, "test").unwrap();
                run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                let got = g.ctx.read_f32(&y, m * n).unwrap();
                let act = elementwise::reference(EltOp::SiluMul, &c.x, &up);
                let want = matmul::reference(&c.w_ref, n, k, &act, m, None, None);
                assert_close(&format!("[{}] gemv+swiglu {} m={m}", g.name, format.name()), &got, &want, TOL);
            }
        }
    }
}

/// Activations the int8 GEMV quantizes without error: each 32-value block is integers in
/// -127..=127 (one of them ±127) times a power of two, so the only error left is f32
/// accumulation and the test holds the kernel to the float reference's tolerance.
fn q8_exact_x(m: usize, k: usize, seed: u64) -> Vec<f32> {
    use rand::Rng;
    let mut r = rng(seed);
    let mut x = vec![0f32; m * k];
    for block in x.chunks_mut(32) {
        let scale = (2f32).powi(-r.random_range(4..10));
        for v in block.iter_mut() {
            *v = r.random_range(-127i32..=127) as f32 * scale;
        }
        let i = r.random_range(0..block.len());
        block[i] = if r.random::<bool>() { 127.0 } else { -127.0 } * scale;
    }
    x
}

/// The int8 GEMV's error bound for arbitrary activations: each x value rounds by at most
/// half its block's step (max |x| / 127 / 2), so |Δy[m, n]| <= sum_k |w[n, k]| step(k) / 2.
fn q8_bound(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let mut bound = vec![0f32; m * n];
    for mi in 0..m {
        let row = &x[mi * k..(mi + 1) * k];
        let step: Vec<f32> = row
            .chunks(32)
            .flat_map(|b| {
                let d = b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                std::iter::repeat_n(d / 2.0, b.len())
            })
            .collect();
        for ni in 0..n {
            let wr = &w[ni * k..(ni + 1) * k];
            bound[mi * n + ni] = wr.iter().zip(&step).map(|(a, s)| a.abs() * s).sum::<f32>() * 1.01;
        }
    }
    bound
}

/// |got - want| <= bound + TOL x max |want|, element by element.
fn assert_within(what: &str, got: &[f32], want: &[f32], bound: &[f32]) {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    for (i, ((g, w), b)) in got.iter().zip(want).zip(bound).enumerate() {
        let d = (g - w).abs();
        assert!(d <= b + TOL * scale, "{what}: index {i}: got {g}, want {w} (|Δ| {d} > bound {b})");
        worst = worst.max(d / (b + TOL * scale));
    }
    eprintln!("{what}: worst |Δ| / bound {worst:.3}");
}

/// The int8-activation GEMV for every quantized format, launch shape and column count:
/// exact on activations it quantizes without error, within the rounding bound otherwise.
#[test]
fn gemv_q8_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL.into_iter().filter(|f| f.is_quantized()) {
            for (m, shape) in [
                (1, GemvShape { wg: 64, rows: 4 }),
                (2, GemvShape { wg: 32, rows: 4 }),
                (3, GemvShape { wg: 64, rows: 2 }),
                (4, GemvShape { wg: 64, rows: 4 }),
            ] {
                // Several x tiles for the 32-invocation shape, a ragged last one.
                let k = if format == WeightFormat::Q8_0 { 32 * 75 } else { 256 * 11 };
                let n = 37;
                let kernel = MatmulKernel::Gemv { ncols: m, shape, q8: true };
                let x = q8_exact_x(m as usize, k, 11 + m as u64);
                let what = format!("[{}] gemv_q8 {} n={n} k={k} m={m}", g.name, format.name());
                assert_exact(&what, run_matmul(&g.ctx, format, n, k, m as usize, kernel, m == 3, m == 4, Some(x)));

                // Normal activations: within the bound of x's rounding.
                let c = case(format, n, k, m as usize, 5 + m as u64);
                let w = WeightTensor::upload(&g.ctx, "w", format, n, k, &c.weights).unwrap();
                let xb = g.ctx.upload_f32(&c.x, "x").unwrap();
                let y = g.ctx.storage((m as usize * n * 4) as u64, "y").unwrap();
                let ds = matmul::prepare_with(&g.ctx, &Matmul::dense(&w, &xb, &y, m), kernel, "test").unwrap();
                run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                let got = g.ctx.read_f32(&y, m as usize * n).unwrap();
                let want = matmul::reference(&c.w_ref, n, k, &c.x, m as usize, None, None);
                assert_within(&format!("{what} randn"), &got, &want, &q8_bound(&c.w_ref, n, k, &c.x, m as usize));
            }
        }
    }
}

/// The int8 GEMV with RMSNorm or SwiGLU fused in front, and on a tensor split across bindings.
#[test]
fn gemv_q8_fused_and_split() {
    use kiln::kernels::elementwise::{self, EltOp};
    let kernel = |m: usize| MatmulKernel::Gemv { ncols: m as u32, shape: GemvShape { wg: 64, rows: 4 }, q8: true };
    for g in gpus() {
        for format in [WeightFormat::Q8_0, WeightFormat::Q4K, WeightFormat::Q5K, WeightFormat::Q6K] {
            let (n, k) = (45usize, k_for(format, 2, 0));
            for m in [1usize, 3] {
                let c = case(format, n, k, m, 78);
                let w = WeightTensor::upload(&g.ctx, "w", format, n, k, &c.weights).unwrap();
                let x = g.ctx.upload_f32(&c.x, "x").unwrap();
                let y = g.ctx.storage((m * n * 4) as u64, "y").unwrap();
                let gamma = randn(&mut rng(5), k, 1.0);
                let up = randn(&mut rng(8), m * k, 1.0);
                let (nw, ub) = (g.ctx.upload_f32(&gamma, "norm").unwrap(), g.ctx.upload_f32(&up, "up").unwrap());
                let cases = [
                    ("norm", Matmul { norm: Some((&nw, 1e-5)), ..Matmul::dense(&w, &x, &y, m as u32) }),
                    ("swiglu", Matmul { glu: Some(&ub), ..Matmul::dense(&w, &x, &y, m as u32) }),
                ];
                for (fused, mm) in cases {
                    let input = match fused {
                        "norm" => kiln::kernels::norm::reference(&c.x, &gamma, k, 1e-5),
                        _ => elementwise::reference(EltOp::SiluMul, &c.x, &up),
                    };
                    let ds = matmul::prepare_with(&g.ctx, &mm, kernel(m), "test").unwrap();
                    run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                    let got = g.ctx.read_f32(&y, m * n).unwrap();
                    let want = matmul::reference(&c.w_ref, n, k, &input, m, None, None);
                    let what = format!("[{}] gemv_q8+{fused} {} m={m}", g.name, format.name());
                    assert_within(&what, &got, &want, &q8_bound(&c.w_ref, n, k, &input, m));
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
        assert_exact(&what, run_matmul(&ctx, format, n, k, 1, kernel(1), true, false, Some(x)));
    }
}

/// Y = silu(gate) * up of interleaved gate/up rows (2i, 2i + 1), as SwiGLU's epilogue writes it.
fn swiglu_reference(y: &[f32], m: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n / 2];
    for r in 0..m {
        for i in 0..n / 2 {
            let (g, u) = (y[r * n + 2 * i] as f64, y[r * n + 2 * i + 1] as f64);
            out[r * n / 2 + i] = (g / (1.0 + (-g).exp()) * u) as f32;
        }
    }
    out
}

/// The fused epilogues against their CPU references, through every kernel kind that carries
/// them (float GEMV, int8 GEMV, register GEMM, cooperative GEMM where the adapter has it):
/// SwiGLU over interleaved gate/up rows, and the stacked Q/K/V projection (biases, NeoX row
/// order, partial rotation) whose epilogue rotates Q into Y and K into the cache and copies V
/// there, for tokens at positions 5.. of an f32 and an f16 cache.
#[test]
fn fused_epilogues_match_reference() {
    let (nh, nkv, hd) = (4usize, 2usize, 64usize);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let n = qd + 2 * kvd;
    let k = 256;
    let pos0 = 5usize;
    for g in gpus() {
        let int8 = g.ctx.caps.int8_dot;
        for format in [WeightFormat::F32, WeightFormat::Q4K] {
            // Each kernel kind once (every variant compiles its own pipeline), with 2- and
            // 4-row GEMV workgroups and a 4x4 and 8x8 GEMM register tile.
            let gemv = |m: u32, wg: u32, rows: u32, q8: bool| MatmulKernel::Gemv {
                ncols: m,
                shape: GemvShape { wg, rows },
                q8,
            };
            let mut kernels: Vec<(String, u32, MatmulKernel)> = vec![
                ("gemv m=1".into(), 1, gemv(1, 64, 4, false)),
                ("gemv m=3".into(), 3, gemv(3, 128, 2, false)),
                ("gemm m=13".into(), 13, MatmulKernel::Gemm { tile: GemmTile::T32 }),
                ("gemm 128x64 m=70".into(), 70, MatmulKernel::Gemm { tile: GemmTile::T128x64 }),
            ];
            if int8 && format != WeightFormat::F32 {
                kernels.push(("gemv_q8 m=2".into(), 2, gemv(2, 128, 2, true)));
            }
            if g.ctx.caps.coopmat && format != WeightFormat::F32 {
                kernels.push(("gemm_coop m=70".into(), 70, MatmulKernel::Gemm { tile: GemmTile::Coop64 }));
            }
            for (what, m, kernel) in &kernels {
                let m = *m as usize;
                let c = case(format, n, k, m, (m * 13 + n) as u64);
                let q8 = matches!(kernel, MatmulKernel::Gemv { q8: true, .. });
                let coop = matches!(kernel, MatmulKernel::Gemm { tile } if tile.is_coop());
                // f32 accumulation of exact weights; int8 activations round x; cooperative
                // matrices round x and W to f16 (2^-11 each, summed over k = 256 products).
                let tol = if q8 {
                    2e-2
                } else if coop {
                    4e-3
                } else {
                    TOL * 4.0
                };
                let plain = matmul::reference(&c.w_ref, n, k, &c.x, m, Some(&c.bias), None);
                let x = g.ctx.upload_f32(&c.x, "x").unwrap();
                let b = g.ctx.upload_f32(&c.bias, "bias").unwrap();
                let w = WeightTensor::upload(&g.ctx, "w", format, n, k, &c.weights).unwrap();
                let run = |mm: &Matmul| {
                    let prep = if q8 {
                        let bm = matmul::BoundMatmul::with_q8(&g.ctx, mm, "test", true).unwrap();
                        let mut enc = g.ctx.device.create_command_encoder(&Default::default());
                        {
                            let mut pass = enc.begin_compute_pass(&Default::default());
                            bm.record(&g.ctx, &mut pass, m as u32, Some(*kernel)).unwrap();
                        }
                        g.ctx.queue.submit([enc.finish()]);
                        return;
                    } else {
                        matmul::prepare_with(&g.ctx, mm, *kernel, "test").unwrap()
                    };
                    run_dispatches(&g.ctx, &prep.iter().collect::<Vec<_>>()).unwrap();
                };

                // SwiGLU: the rows taken as interleaved gate/up pairs.
                let y = g.ctx.storage((m * n / 2 * 4) as u64, "act").unwrap();
                let mm = Matmul {
                    epi: Epilogue::SwiGlu,
                    bias: Some(&b),
                    y_stride: (n / 2) as u32,
                    ..Matmul::dense(&w, &x, &y, m as u32)
                };
                run(&mm);
                let got = g.ctx.read_f32(&y, m * n / 2).unwrap();
                assert_close(
                    &format!("[{}] {format} {what} swiglu", g.name),
                    &got,
                    &swiglu_reference(&plain, m, n),
                    tol,
                );

                for (neox, n_rot, f16_kv) in [(false, 48, false), (true, 32, true)] {
                    if neox && !g.ctx.caps.f16 {
                        continue;
                    }
                    let kv = KvKind::for_cache(f16_kv, &g.ctx.caps);
                    let n_ctx = pos0 + m + 3;
                    let cache_bytes = (n_ctx * kvd * kv.bytes_per_elem() as usize) as u64;
                    let (kc, vc) = (g.ctx.storage(cache_bytes, "k").unwrap(), g.ctx.storage(cache_bytes, "v").unwrap());
                    let q = g.ctx.storage((m * qd * 4) as u64, "q").unwrap();
                    let rope = g.ctx.uniform(
                        &RopeShape {
                            q_dim: qd as u32,
                            kv_dim: kvd as u32,
                            head_dim: hd as u32,
                            n_rot: n_rot as u32,
                            freq_base: 10000.0,
                            freq_scale: 0.5,
                            kv_stride: kvd as u32,
                            _pad: 0,
                        },
                        "rope",
                    );
                    let step = StepState { n_tokens: m as u32, pos0: pos0 as u32, kv_len: (pos0 + m) as u32, _pad: 0 };
                    let step = g.ctx.upload(bytemuck::bytes_of(&step), "step").unwrap();
                    // The stacked weights in NeoX row order (and the bias with them): row r of
                    // the stacked matrix holds plain row `src(r)`.
                    let src = |r: usize| {
                        if neox && r < qd + kvd {
                            r - r % hd + kiln::model::weights::neox_row(r % hd, n_rot)
                        } else {
                            r
                        }
                    };
                    let rb = format.row_bytes(k).unwrap();
                    let stacked: Vec<u8> =
                        (0..n).flat_map(|r| c.weights[src(r) * rb..(src(r) + 1) * rb].to_vec()).collect();
                    let bias_stacked: Vec<f32> = (0..n).map(|r| c.bias[src(r)]).collect();
                    let ws = WeightTensor::upload(&g.ctx, "qkv", format, n, k, &stacked).unwrap();
                    let bs = g.ctx.upload_f32(&bias_stacked, "bias").unwrap();
                    let mm = Matmul {
                        bias: Some(&bs),
                        y_stride: qd as u32,
                        epi: Epilogue::Qkv {
                            k_cache: &kc,
                            v_cache: &vc,
                            kv,
                            neox,
                            rope: &rope,
                            step: &step,
                            row_base: 0,
                        },
                        ..Matmul::dense(&ws, &x, &q, m as u32)
                    };
                    run(&mm);
                    // Reference: rotate each head's pairs of the plain result.
                    let rotate = |v: &[f32], pos: usize| -> Vec<f32> {
                        let mut o = v.to_vec();
                        for i in 0..n_rot / 2 {
                            let (a, b) = if neox { (i, i + n_rot / 2) } else { (2 * i, 2 * i + 1) };
                            let th = pos as f64 * 0.5 * 10000f64.powf(-2.0 * i as f64 / n_rot as f64);
                            let (x0, x1) = (v[a] as f64, v[b] as f64);
                            o[a] = (x0 * th.cos() - x1 * th.sin()) as f32;
                            o[b] = (x0 * th.sin() + x1 * th.cos()) as f32;
                        }
                        o
                    };
                    let (mut want_q, mut want_k, mut want_v) = (Vec::new(), Vec::new(), Vec::new());
                    for r in 0..m {
                        let row = &plain[r * n..(r + 1) * n];
                        for h in 0..nh {
                            want_q.extend(rotate(&row[h * hd..(h + 1) * hd], pos0 + r));
                        }
                        for h in 0..nkv {
                            want_k.extend(rotate(&row[qd + h * hd..qd + (h + 1) * hd], pos0 + r));
                        }
                        want_v.extend_from_slice(&row[qd + kvd..]);
                    }
                    let cache_rows = |buf: &wgpu::Buffer| -> Vec<f32> {
                        let bytes = g
                            .ctx
                            .read_bytes(
                                buf,
                                (pos0 * kvd) as u64 * kv.bytes_per_elem(),
                                (m * kvd) as u64 * kv.bytes_per_elem(),
                            )
                            .unwrap();
                        if kv == KvKind::F32 {
                            bytemuck::pod_collect_to_vec(&bytes)
                        } else {
                            bytes.chunks(2).map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32()).collect()
                        }
                    };
                    let what = format!("[{}] {format} {what} qkv neox={neox} n_rot={n_rot} {kv:?}", g.name);
                    let kv_tol = if kv == KvKind::F32 { tol } else { tol.max(1e-3) };
                    assert_close(&format!("{what} q"), &g.ctx.read_f32(&q, m * qd).unwrap(), &want_q, tol);
                    assert_close(&format!("{what} k"), &cache_rows(&kc), &want_k, kv_tol);
                    assert_close(&format!("{what} v"), &cache_rows(&vc), &want_v, kv_tol);
                }
            }
        }
    }
}

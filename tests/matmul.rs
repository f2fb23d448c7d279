//! GEMV and GEMM for every weight format against the CPU reference, on ragged shapes, with
//! and without subgroups, and on tensors split across bindings.
//! Tolerance: max |Δ| <= 2e-5 x max |y| (f32 accumulation of exact dequantized weights,
//! against an f64 reference).

mod common;

use common::*;
use kiln::gpu::{run_dispatches, GpuContext, WeightTensor};
use kiln::kernels::matmul::{self, Matmul};
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

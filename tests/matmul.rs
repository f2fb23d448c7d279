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

fn run_case(
    ctx: &GpuContext,
    format: WeightFormat,
    n: usize,
    k: usize,
    m: usize,
    kernel: MatmulKernel,
    bias: bool,
    accumulate: bool,
    what: &str,
) {
    let c = case(format, n, k, m, (n * 31 + k * 7 + m) as u64);
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
    assert_close(what, &got, &want, TOL);
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
                let kernel = MatmulKernel::Gemv { ncols: m, shape };
                let what = format!("[{}] gemv {} n={n} k={k} m={m}", g.name, format.name());
                run_case(&g.ctx, format, n, k, m as usize, kernel, m == 3, m == 8, &what);
            }
        }
    }
}

#[test]
fn gemm_every_format() {
    for g in gpus() {
        for format in WeightFormat::ALL {
            for (m, n, tile) in [(9usize, 45usize, GemmTile::T32), (70, 130, GemmTile::T128)] {
                let k = k_for(format, 2, 100);
                let kernel = MatmulKernel::Gemm { tile };
                let what = format!("[{}] gemm {} m={m} n={n} k={k} {tile:?}", g.name, format.name());
                run_case(&g.ctx, format, n, k, m, kernel, m == 9, m == 70, &what);
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
        assert_close(&format!("planned m={m}"), &got, &matmul::reference(&c.w_ref, n, k, &c.x, m, None, None), TOL);
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
            MatmulKernel::Gemv { ncols: 1, shape: GemvShape { wg: 64, rows: 4 } },
            MatmulKernel::Gemm { tile: GemmTile::T32 },
        ] {
            run_case(
                &ctx,
                format,
                n,
                k,
                if matches!(kernel, MatmulKernel::Gemm { .. }) { 20 } else { 1 },
                kernel,
                true,
                false,
                &format!("split {} {kernel}", format.name()),
            );
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
                let kernel = MatmulKernel::Gemv { ncols: m as u32, shape: GemvShape { wg: 64, rows: 4 } };
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
                let kernel = MatmulKernel::Gemv { ncols: m as u32, shape: GemvShape { wg: 64, rows: 4 } };
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

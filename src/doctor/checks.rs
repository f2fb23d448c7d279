//! The doctor's kernel checks: for an adapter's capabilities, which variants to run (those
//! the planner picks there) on which small ragged shapes, against which reference and
//! tolerance. The tolerances are the test suite's.

use crate::error::Result;
use crate::gpu::Caps;
use crate::kernels::elementwise::EltOp;
use crate::kernels::nll::{self, NllParams};
use crate::kernels::rope::{self, RopeMode};
use crate::kernels::{argmax, embed, norm, KvKind};
use crate::plan::{GemmTile, MatmulKernel};
use crate::quant::{dequantize, quantize, WeightFormat};
use crate::sample::SamplerConfig;

use super::checker::Checker;
use super::data::{k_for, k_for_coop, model_logits, q8_exact_x, MatmulCase, Rng};
use super::matmul::{self as mm, coop_bound, q8_bound, Epi, Input, QkvShape, Run};
use super::ops::{self, AttnCase};
use super::variants::{decode_attention_shapes, gemv_widths, planned_matmuls, Widths};

/// Float kernels: f32 accumulation of exactly decoded weights against an f64 reference.
pub const MATMUL_TOL: f32 = 2e-5;
/// Epilogue outputs of the int8 GEMV, which rounds activations to 8 bits on purpose.
pub const Q8_EPILOGUE_TOL: f32 = 2e-2;
/// Epilogue outputs of the cooperative-matrix GEMM, which rounds activations and weights to
/// f16 (2^-11 each, summed over k = 256 products).
pub const COOP_EPILOGUE_TOL: f32 = 4e-3;

/// The capabilities a check's kernels are built with: the pass with the fallbacks forced
/// reruns only the checks whose kernels change when these are off.
#[derive(Debug, Clone, Copy, Default)]
pub struct Uses {
    pub subgroups: bool,
    pub f16: bool,
}

impl Uses {
    const NONE: Uses = Uses { subgroups: false, f16: false };
    const SUBGROUPS: Uses = Uses { subgroups: true, f16: false };
    const F16: Uses = Uses { subgroups: false, f16: true };
    const BOTH: Uses = Uses { subgroups: true, f16: true };

    /// Whether the kernels differ between adapters with capabilities `a` and `b`.
    pub fn differ(&self, a: &Caps, b: &Caps) -> bool {
        (self.subgroups && a.subgroups != b.subgroups) || (self.f16 && a.f16 != b.f16)
    }
}

/// What a check does with a device.
pub type Body = Box<dyn Fn(&mut Checker) -> Result<()> + Send + Sync>;

pub struct Check {
    pub name: String,
    pub uses: Uses,
    /// The comparisons to make, or why there is nothing to run on this adapter.
    pub body: std::result::Result<Body, String>,
}

fn check(
    name: impl Into<String>,
    uses: Uses,
    body: impl Fn(&mut Checker) -> Result<()> + Send + Sync + 'static,
) -> Check {
    Check { name: name.into(), uses, body: Ok(Box::new(body)) }
}

fn skip(name: &str, why: String) -> Check {
    Check { name: name.into(), uses: Uses::NONE, body: Err(why) }
}

/// Matmul kernels per check of the fused inputs and epilogues.
const FUSED_KERNELS_PER_CHECK: usize = 1;

/// Every kernel check for an adapter with `caps`, in the order they run. GEMVs run at one
/// column (decode), the most and one width between, spread over the formats so that every
/// width runs; `every_width`: every format at every width.
pub fn kernel_checks(caps: &Caps, every_width: bool) -> Vec<Check> {
    let mut v = Vec::new();
    let planned: Vec<(WeightFormat, Vec<MatmulKernel>)> = WeightFormat::ALL
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            (f, gemv_widths(&planned_matmuls(f, caps), if every_width { Widths::All } else { Widths::EndsAnd(i) }))
        })
        .collect();
    let pick = |f: &Vec<MatmulKernel>, which: fn(&MatmulKernel) -> bool| -> Vec<MatmulKernel> {
        f.iter().copied().filter(which).collect()
    };
    let gemv = |k: &MatmulKernel| matches!(k, MatmulKernel::Gemv { q8: false, .. });
    let gemv_q8 = |k: &MatmulKernel| matches!(k, MatmulKernel::Gemv { q8: true, .. });
    let gemm = |k: &MatmulKernel| matches!(k, MatmulKernel::Gemm { tile } if !tile.is_coop());
    // The subgroup-scope tiles (every format, ragged shapes, bias) and the workgroup-scope one
    // (F16 whole tiles, plain epilogue: `cm2_matmuls`) apart.
    let coop = |k: &MatmulKernel| matches!(k, MatmulKernel::Gemm { tile } if tile.is_coop() && *tile != GemmTile::Cm2);
    let cm2 = |k: &MatmulKernel| *k == MatmulKernel::Gemm { tile: GemmTile::Cm2 };
    for (f, kernels) in &planned {
        v.push(check(format!("gemv {f}"), Uses::SUBGROUPS, plain_matmuls(*f, pick(kernels, gemv))));
    }
    for (f, kernels) in planned.iter().filter(|(f, _)| f.is_quantized()) {
        let ks = pick(kernels, gemv_q8);
        if !ks.is_empty() {
            v.push(check(format!("gemv_q8 {f}"), Uses::SUBGROUPS, q8_matmuls(*f, ks)));
        }
    }
    if !planned.iter().any(|(_, ks)| ks.iter().any(gemv_q8)) {
        v.push(skip("gemv_q8", no_int8_reason(caps)));
    }
    for (f, kernels) in &planned {
        v.push(check(format!("gemm {f}"), Uses::NONE, plain_matmuls(*f, pick(kernels, gemm))));
    }
    for (f, kernels) in &planned {
        let ks = pick(kernels, coop);
        if !ks.is_empty() {
            v.push(check(format!("gemm_coop {f}"), Uses::NONE, coop_matmuls(*f, ks)));
        }
    }
    if !caps.coopmat {
        v.push(skip("gemm_coop", "no cooperative matrices with 16x16 f16 tiles and 32-wide subgroups".into()));
    }
    match planned.iter().find(|(_, ks)| ks.iter().any(cm2)) {
        Some((f, _)) => v.push(check(format!("gemm_cm2 {f}"), Uses::NONE, cm2_matmuls())),
        None => v.push(skip(
            "gemm_cm2",
            "no workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2) on this device".into(),
        )),
    }
    // Long prompts' GEMMs over K-quants read an f16 copy of the weights (`Caps::dequant_f16_from`).
    let copies = WeightFormat::ALL.into_iter().filter(|&f| crate::plan::dequant_f16_format(f));
    match caps.dequant_f16_from {
        Some(_) => v.extend(copies.map(|f| check(format!("gemm over an f16 copy {f}"), Uses::F16, copy_matmuls(f)))),
        None => v.push(skip("gemm over an f16 copy", "long prompts' GEMMs decode K-quants in their tiles here".into())),
    }
    // The fused inputs and epilogues are the same code for every weight format: they run on
    // the commonest quantized one, and the GEMM's on a float one too (its weights load as
    // vectors).
    // Each runs every fused variant of its kernels (a pipeline each): in checks of a few
    // kernels, so that they spread over the doctor's threads instead of one thread compiling
    // dozens of pipelines after the others are done.
    let mut fused = |name: String, uses: Uses, ks: Vec<MatmulKernel>, f: WeightFormat| {
        let parts = ks.chunks(FUSED_KERNELS_PER_CHECK).count();
        for (i, part) in ks.chunks(FUSED_KERNELS_PER_CHECK).enumerate() {
            let name = if parts > 1 { format!("{name} [{}/{parts}]", i + 1) } else { name.clone() };
            v.push(check(name, uses, fused_matmuls(f, part.to_vec(), caps.f16)));
        }
    };
    for f in [WeightFormat::F16, WeightFormat::Q4K] {
        let ks = gemv_widths(&planned_matmuls(f, caps), Widths::Ends);
        if f.is_quantized() {
            fused(format!("fused gemv {f}"), Uses::BOTH, pick(&ks, gemv), f);
            fused(format!("fused gemv_q8 {f}"), Uses::BOTH, pick(&ks, gemv_q8), f);
        }
        fused(format!("fused gemm {f}"), Uses::F16, pick(&ks, gemm), f);
        fused(format!("fused gemm_coop {f}"), Uses::F16, pick(&ks, coop), f);
    }
    v.push(check("rms_norm", Uses::SUBGROUPS, rms_norm));
    v.push(check("silu_mul, add", Uses::NONE, elementwise));
    v.push(check("embed", Uses::NONE, gather));
    v.push(check("rope", Uses::F16, rope_checks));
    v.push(check("kv_write", Uses::F16, kv_write));
    v.push(check("attention prefill", Uses::BOTH, attention_prefill));
    v.push(check("attention decode", Uses::BOTH, attention_decode));
    v.push(check("attention decode, batched", Uses::BOTH, attention_decode_batched));
    let coop_decode = "attention decode, cooperative matrices";
    if caps.coopmat && caps.subgroups && !caps.cpu_adapter {
        v.push(check(coop_decode, Uses::NONE, attention_decode_coop));
    } else {
        v.push(skip(coop_decode, "no cooperative matrices with 16x16 f16 tiles and 32-wide subgroups".into()));
    }
    v.push(check("argmax", Uses::SUBGROUPS, argmax_rows));
    v.push(check("nll", Uses::SUBGROUPS, nll_rows));
    v.push(check("sampler", Uses::SUBGROUPS, sampler));
    v
}

fn no_int8_reason(caps: &Caps) -> String {
    if !caps.int8_dot {
        "no native integer dot products on this adapter (the int8 GEMV runs on Vulkan)".into()
    } else {
        "not planned on CPU adapters (the float GEMV is faster there)".into()
    }
}

/// Columns a GEMV check runs: the kernel's own, or for a workgroup of the most columns,
/// two groups and a ragged third (workgroup_id.z), as prompts past one group run it.
fn gemv_cols(kernel: MatmulKernel) -> usize {
    match kernel {
        MatmulKernel::Gemv { ncols, q8, shape } => {
            if ncols == crate::plan::gemv_group_cols(q8)
                || (shape.groups > 1 && ncols == crate::plan::GEMV_Q8_WIDE_COLS)
            {
                2 * ncols as usize + 1
            } else {
                ncols as usize
            }
        }
        MatmulKernel::Gemm { .. } => 0,
    }
}

/// (m, n, k) a kernel runs on: ragged against its tiles and rows per workgroup.
fn shape_for(kernel: MatmulKernel, format: WeightFormat) -> (usize, usize, usize) {
    match kernel {
        MatmulKernel::Gemv { q8: false, .. } => (gemv_cols(kernel), 37, k_for(format, 3, 171)),
        // Several of the int8 GEMV's x tiles, a ragged last one.
        MatmulKernel::Gemv { q8: true, .. } => {
            (gemv_cols(kernel), 37, if format == WeightFormat::Q8_0 { 32 * 75 } else { 256 * 11 })
        }
        MatmulKernel::Gemm { .. } => (137, 130, k_for(format, 2, 100)),
    }
}

fn seed(m: usize, n: usize, k: usize) -> u64 {
    (n * 31 + k * 7 + m) as u64
}

/// Y = X·Wᵀ through each kernel, with a bias and accumulation into Y on some of them.
fn plain_matmuls(format: WeightFormat, kernels: Vec<MatmulKernel>) -> impl Fn(&mut Checker) -> Result<()> {
    move |ck| {
        for (i, &kernel) in kernels.iter().enumerate() {
            let (m, n, k) = shape_for(kernel, format);
            let c = MatmulCase::new(format, n, k, m, seed(m, n, k))?;
            let out = mm::run(ck.ctx, &c, &Run::plain(kernel, i % 2 == 0, i % 3 == 1))?;
            ck.ran(1);
            let y = &out.outputs[0];
            ck.close(format!("{kernel} m={m} n={n} k={k}"), &y.got, &y.want, MATMUL_TOL);
        }
        Ok(())
    }
}

/// The int8 GEMV: exact on activations it rounds without error, within the rounding bound
/// on Gaussian ones.
fn q8_matmuls(format: WeightFormat, kernels: Vec<MatmulKernel>) -> impl Fn(&mut Checker) -> Result<()> {
    move |ck| {
        for (i, &kernel) in kernels.iter().enumerate() {
            let (m, n, k) = shape_for(kernel, format);
            let mut c = MatmulCase::new(format, n, k, m, seed(m, n, k))?;
            let gauss = mm::run(ck.ctx, &c, &Run::plain(kernel, false, false))?;
            c.x = q8_exact_x(m, k, 11 + m as u64);
            let exact = mm::run(ck.ctx, &c, &Run::plain(kernel, i % 2 == 0, i % 3 == 1))?;
            ck.ran(1);
            let (e, g) = (&exact.outputs[0], &gauss.outputs[0]);
            ck.close(format!("{kernel} m={m} n={n} k={k} exact x"), &e.got, &e.want, MATMUL_TOL);
            let bound = q8_bound(&c.w_ref, n, k, &gauss.input, m);
            ck.within(format!("{kernel} m={m} n={n} k={k} gaussian x"), &g.got, &g.want, &bound, MATMUL_TOL);
        }
        Ok(())
    }
}

/// The cooperative-matrix GEMM, within the bound of rounding both operands to f16.
fn coop_matmuls(format: WeightFormat, kernels: Vec<MatmulKernel>) -> impl Fn(&mut Checker) -> Result<()> {
    let runs = kernels.into_iter().map(|k| (k.to_string(), Run::plain(k, false, false))).collect();
    f16_matmuls(format, runs, [(70, 130, 2, false, true), (9, 45, 3, true, false)])
}

/// The workgroup-scope GEMM (F16 weights, whole tiles, Y's plain write with and without the
/// residual add), within the bound of rounding both operands to f16.
fn cm2_matmuls() -> impl Fn(&mut Checker) -> Result<()> {
    move |ck| {
        let kernel = MatmulKernel::Gemm { tile: GemmTile::Cm2 };
        for (m, n, k, accumulate) in [(128usize, 256usize, 128usize, false), (384, 512, 256, true)] {
            let c = MatmulCase::new(WeightFormat::F16, n, k, m, seed(m, n, k))?;
            let out = mm::run(ck.ctx, &c, &Run::plain(kernel, false, accumulate))?;
            let y = &out.outputs[0];
            let bound = coop_bound(&c.w_ref, n, k, &c.x, m);
            ck.within(format!("{kernel} m={m} n={n} k={k}"), &y.got, &y.want, &bound, MATMUL_TOL);
        }
        ck.ran(1);
        Ok(())
    }
}

/// The planner's GEMM over an f16 copy of K-quant weights (the copy's decoder first), within
/// the bound of rounding both operands to f16.
fn copy_matmuls(format: WeightFormat) -> impl Fn(&mut Checker) -> Result<()> {
    let run = Run { dequant: true, ..Run::plain(MatmulKernel::Gemm { tile: GemmTile::T32 }, false, false) };
    f16_matmuls(format, vec![("f16 copy".into(), run)], [(70, 130, 2, true, false), (300, 46, 3, false, true)])
}

/// GEMMs whose operands are rounded to f16, within that bound: each of `runs` (a name and the
/// run) over `shapes` (m, n, blocks of k, bias, residual add).
fn f16_matmuls(
    format: WeightFormat,
    runs: Vec<(String, Run)>,
    shapes: [(usize, usize, usize, bool, bool); 2],
) -> impl Fn(&mut Checker) -> Result<()> {
    move |ck| {
        for (name, run) in &runs {
            for (m, n, blocks, bias, accumulate) in shapes {
                let k = k_for_coop(format, blocks);
                let c = MatmulCase::new(format, n, k, m, seed(m, n, k))?;
                let out = mm::run(ck.ctx, &c, &Run { bias, accumulate, ..run.clone() })?;
                let y = &out.outputs[0];
                let bound = coop_bound(&c.w_ref, n, k, &c.x, m);
                ck.within(format!("{name} m={m} n={n} k={k}"), &y.got, &y.want, &bound, MATMUL_TOL);
            }
            ck.ran(1);
        }
        Ok(())
    }
}

/// The Q/K/V epilogues a device runs: adjacent-pair RoPE into an f32 and an f16 cache
/// (partial rotation), and NeoX into an f16 cache where the adapter has f16 shaders (without
/// them, NeoX models keep separate projections). The last is the default (an f16 cache).
pub fn qkv_shapes(f16_shaders: bool) -> Vec<QkvShape> {
    let s = |neox, n_rot, kv| QkvShape {
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        n_rot,
        neox,
        kv,
        pos0: 5,
        freq_base: 10000.0,
        freq_scale: 0.5,
        v_format: None,
        one_dispatch: false,
        kv_base: 0,
        batched: false,
    };
    let f16_cache = if f16_shaders { KvKind::F16Native } else { KvKind::F16Packed };
    let mut v = vec![s(false, 48, KvKind::F32), s(false, 64, f16_cache)];
    if f16_shaders {
        v.push(s(true, 32, f16_cache));
    }
    v
}

/// Q4_K_M's Q/K/V as Llama models decode it: Q and K rows in Q4_K, V's in Q6_K, two parts
/// of the stacked projection (the second from row q + kv), into the default cache.
pub fn qkv_v_part_shape(f16_shaders: bool) -> QkvShape {
    let mut s = qkv_shapes(f16_shaders)[1];
    s.v_format = Some(WeightFormat::Q6K);
    s
}

/// Fused inputs (GEMV: RMSNorm, SiLU·up) and epilogues (SwiGLU; Q/K/V with RoPE and the
/// cache write, after the RMSNorm on GEMVs as decode runs them) through each kernel.
fn fused_matmuls(format: WeightFormat, kernels: Vec<MatmulKernel>, f16: bool) -> impl Fn(&mut Checker) -> Result<()> {
    move |ck| {
        let k = 256;
        for (i, &kernel) in kernels.iter().enumerate() {
            let (gemv, q8, coop) = match kernel {
                MatmulKernel::Gemv { q8, .. } => (true, q8, false),
                MatmulKernel::Gemm { tile } => (false, false, tile.is_coop()),
            };
            let m = match kernel {
                MatmulKernel::Gemv { .. } => gemv_cols(kernel),
                MatmulKernel::Gemm { .. } => 70,
            };
            let tol = if q8 {
                Q8_EPILOGUE_TOL
            } else if coop {
                COOP_EPILOGUE_TOL
            } else {
                4.0 * MATMUL_TOL
            };
            let mut r = Rng::new(m as u64 + 5);
            let norm = Input::Norm { gamma: r.normal(k, 1.0), eps: 1e-5 };
            // (what, input, epilogue, rows, K ranges)
            let mut runs: Vec<(String, Input, Epi, usize, u32)> = Vec::new();
            if gemv {
                runs.push(("+rms_norm".into(), norm.clone(), Epi::Plain, 45, 1));
                runs.push(("+silu·up".into(), Input::Glu { up: r.normal(m * k, 1.0) }, Epi::Plain, 45, 1));
            }
            let input = if gemv { norm.clone() } else { Input::Plain };
            runs.push(("swiglu".into(), input.clone(), Epi::SwiGlu, 66, 1));
            // Every Q/K/V epilogue through the first kernel, the default one (an f16 cache)
            // through the others.
            let shapes = qkv_shapes(f16);
            let n_shapes = if i == 0 { shapes.len() } else { 1 };
            let mut shapes: Vec<QkvShape> = shapes.into_iter().rev().take(n_shapes).collect();
            // Q4_K weights: V in Q6_K, a part of its own, through every kernel too; and on
            // one-column GEMVs whose workgroups stay in one part, both parts in one dispatch,
            // as one-token decode steps run them (`BoundMatmul::two_formats_in`).
            if format == WeightFormat::Q4K {
                let s = qkv_v_part_shape(f16);
                shapes.push(s);
                if let MatmulKernel::Gemv { ncols: 1, shape, .. } = kernel {
                    if m == 1 && (s.q_dim() + s.kv_dim()) as u32 % shape.rows_per_workgroup() == 0 {
                        shapes.push(QkvShape { one_dispatch: true, ..s });
                    }
                }
            }
            for s in shapes {
                let part = match (s.v_format, s.one_dispatch) {
                    (Some(f), false) => format!(" +V part {f}"),
                    (Some(f), true) => format!(" +V {f} in one dispatch"),
                    (None, _) => String::new(),
                };
                let what = format!("qkv neox={} n_rot={} {:?}{part}", s.neox, s.n_rot, s.kv);
                runs.push((what, input.clone(), Epi::Qkv(s), s.rows(), 1));
            }
            // GEMMs with few tiles run split along K on GPUs (plan::gemm_splits): the partial
            // sums, then the epilogue in a pass of its own.
            if !gemv && !ck.ctx.caps.cpu_adapter {
                runs.push(("swiglu split-K 3".into(), Input::Plain, Epi::SwiGlu, 66, 3));
                if let Some(&default) = qkv_shapes(f16).last() {
                    let what = format!("qkv {:?} split-K 3", default.kv);
                    runs.push((what, Input::Plain, Epi::Qkv(default), default.rows(), 3));
                }
            }
            // A batched decode step's epilogue (kiln serve's continuous batching), on GEMVs of
            // two columns and more: each column its own sequence, in a slot of a shared cache.
            if gemv && m >= 2 {
                if let Some(&default) = qkv_shapes(f16).last() {
                    let s = QkvShape { batched: true, kv_base: 7, ..default };
                    runs.push((format!("qkv batched {:?}", s.kv), input.clone(), Epi::Qkv(s), s.rows(), 1));
                }
            }
            for (what, input, epi, n, splits) in runs {
                let c = MatmulCase::new(format, n, k, m, seed(m, n, k))?;
                let plain_epi = matches!(epi, Epi::Plain);
                let out = mm::run(
                    ck.ctx,
                    &c,
                    &Run { kernel, bias: !plain_epi, accumulate: false, input, epi, splits, dequant: false },
                )?;
                ck.ran(1);
                for o in &out.outputs {
                    let what = format!("{kernel} m={m} {what} {}", o.what);
                    if plain_epi && q8 {
                        let bound = q8_bound(&c.w_ref, n, k, &out.input, m);
                        ck.within(what, &o.got, &o.want, &bound, MATMUL_TOL);
                    } else if plain_epi {
                        ck.close(what, &o.got, &o.want, MATMUL_TOL);
                    } else {
                        ck.close(what, &o.got, &o.want, if o.f16 { tol.max(1e-3) } else { tol });
                    }
                }
            }
            // Where one-token steps run the gate/up projection writing the down projection's
            // int8 input (`Caps::q8_swiglu`), that kernel too, its blocks checked as well.
            if let (true, 1, Some(shape)) = (q8, m, ck.ctx.caps.q8_swiglu) {
                let kernel = MatmulKernel::Gemv { ncols: 1, shape, q8: true };
                let c = MatmulCase::new(format, 192, k, 1, seed(1, 192, k))?;
                let run = Run {
                    kernel,
                    bias: true,
                    accumulate: false,
                    input: input.clone(),
                    epi: Epi::SwiGluQ8,
                    splits: 1,
                    dequant: false,
                };
                let out = mm::run(ck.ctx, &c, &run)?;
                ck.ran(1);
                for o in &out.outputs {
                    ck.close(format!("{kernel} m=1 swiglu+int8 blocks {}", o.what), &o.got, &o.want, tol);
                }
            }
            // Where one-token steps run the output and down projections writing the next
            // GEMV's int8 input through its norm (`Caps::q8_add_norm`), that kernel too, adding
            // to the residual, its blocks and their sums of squares checked as well.
            if let (true, 1, Some(shape), Input::Plain) = (q8, m, ck.ctx.caps.q8_add_norm, &input) {
                let kernel = MatmulKernel::Gemv { ncols: 1, shape, q8: true };
                let c = MatmulCase::new(format, 96, k, 1, seed(1, 96, k))?;
                let run = Run { epi: Epi::AddQ8Norm, ..Run::plain(kernel, true, true) };
                let out = mm::run(ck.ctx, &c, &run)?;
                ck.ran(1);
                for o in &out.outputs {
                    let bound = q8_bound(&c.w_ref, 96, k, &out.input, 1);
                    ck.within(
                        format!("{kernel} m=1 residual+int8 blocks {}", o.what),
                        &o.got,
                        &o.want,
                        &bound,
                        MATMUL_TOL,
                    );
                }
            }
        }
        Ok(())
    }
}

fn rms_norm(ck: &mut Checker) -> Result<()> {
    for (rows, n) in [(3usize, 64usize), (5, 1000), (2, 37)] {
        let mut r = Rng::new(n as u64);
        let (x, w) = (r.normal(rows * n, 2.0), r.normal(n, 1.0));
        let got = ops::rms_norm(ck.ctx, &x, &w, rows, n, 1e-5)?;
        ck.close(format!("{rows}x{n}"), &got, &norm::reference(&x, &w, n, 1e-5), 1e-5);
    }
    ck.ran(1);
    Ok(())
}

fn elementwise(ck: &mut Checker) -> Result<()> {
    let mut r = Rng::new(7);
    let (a, b) = (r.normal(1003, 3.0), r.normal(1003, 1.0));
    for op in [EltOp::SiluMul, EltOp::Add] {
        let got = ops::elementwise(ck.ctx, op, &a, &b)?;
        ck.close(format!("{op:?} n=1003"), &got, &crate::kernels::elementwise::reference(op, &a, &b), 1e-6);
        ck.ran(1);
    }
    Ok(())
}

/// Rows of a table in every format, decoded on the GPU bit for bit as on the CPU.
fn gather(ck: &mut Checker) -> Result<()> {
    for format in WeightFormat::ALL {
        let (rows, k) = (23usize, k_for(format, 2, 70));
        let vals = Rng::new(rows as u64).normal(rows * k, 1.0);
        let bad = |e: crate::quant::QuantError| crate::KilnError::invalid("check data", e.to_string());
        let bytes = quantize(format, &vals).map_err(bad)?;
        let mut table = vec![0f32; rows * k];
        dequantize(format, &bytes, rows * k, &mut table).map_err(bad)?;
        let ids = [22u32, 0, 17, 3, 5, 22];
        let got = ops::gather(ck.ctx, format, rows, k, &bytes, &ids)?;
        ck.bits(format!("{format} {rows}x{k}"), &got, &embed::reference(&table, k, &ids));
        ck.ran(1);
    }
    Ok(())
}

/// RoPE in place (Q) and into an f32 and an f16 cache (K), both layouts, at positions up to
/// ~1000. Tolerance 2e-4: f32 angles against an f64 reference (2e-3 through f16).
fn rope_checks(ck: &mut Checker) -> Result<()> {
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        for (t, h, hd, nr, pos0) in [(5u32, 3u32, 16u32, 16u32, 0u32), (2, 4, 64, 32, 977)] {
            let p = ops::rope_params(t, h, hd, nr, pos0);
            let x = Rng::new(hd as u64).normal((t * h * hd) as usize, 1.0);
            let want = rope::reference(&x, mode, &p);
            let what = format!("{mode:?} t={t} h={h} hd={hd} rot={nr} pos0={pos0}");
            ck.close(format!("{what} in place"), &ops::rope_in_place(ck.ctx, mode, &x, p)?, &want, 2e-4);
            for f16_cache in [false, true] {
                let kv = KvKind::for_cache(f16_cache, &ck.ctx.caps);
                let got = ops::rope_to_cache(ck.ctx, mode, kv, &x, p)?;
                ck.close(format!("{what} -> {kv:?} cache"), &got, &want, if f16_cache { 2e-3 } else { 2e-4 });
            }
        }
        ck.ran(3);
    }
    Ok(())
}

/// K rotated and V copied into an f32 and an f16 cache by one dispatch.
fn kv_write(ck: &mut Checker) -> Result<()> {
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        for f16_cache in [false, true] {
            let p = ops::rope_params(3, 2, 16, 16, 5);
            let n = 3 * 2 * 16;
            let (k, v) = (Rng::new(21).normal(n, 1.0), Rng::new(22).normal(n, 1.0));
            let kv = KvKind::for_cache(f16_cache, &ck.ctx.caps);
            let (got_k, got_v) = ops::kv_write(ck.ctx, mode, kv, &k, &v, p)?;
            let tol = if f16_cache { 2e-3 } else { 2e-4 };
            ck.close(format!("{mode:?} {kv:?} K"), &got_k, &rope::reference(&k, mode, &p), tol);
            ck.close(format!("{mode:?} {kv:?} V"), &got_v, &v, if f16_cache { 1e-3 } else { 0.0 });
            ck.ran(1);
        }
    }
    Ok(())
}

/// Prefill attention (GQA, causal, queries at the start and the end of the cache) over an
/// f32 and an f16 cache, against an f64 reference on the same cache values. Tolerance 1e-4.
fn attention_prefill(ck: &mut Checker) -> Result<()> {
    use crate::kernels::attention::AttnShape;
    for (nh, nkv, hd, n_ctx) in [(8u32, 2u32, 16u32, 77u32), (4, 4, 64, 40)] {
        let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
        for f16_cache in [false, true] {
            let kv = KvKind::for_cache(f16_cache, &ck.ctx.caps);
            let mut r = Rng::new((nh * hd) as u64);
            let case = AttnCase::new(ck.ctx, shape, kv, &mut r)?;
            for (m, pos0) in [(7u32, 0u32), (13, n_ctx - 18)] {
                let q = r.normal((m * nh * hd) as usize, 1.0);
                let got = case.prefill(ck.ctx, &q, m, pos0)?;
                let what = format!("nh={nh} kv={nkv} hd={hd} m={m} pos0={pos0} {kv:?}");
                ck.close(what, &got, &case.reference(&q, m as usize, pos0 as usize), 1e-4);
            }
            ck.ran(1);
        }
    }
    Ok(())
}

/// Decode attention in both of its launch shapes: one query head per workgroup (the
/// planner's choice up to `attention::DECODE_SHARE_FROM` positions), and each GQA block of 2
/// to 8 heads sharing their K and V reads (GQA groups of 1 to 8, the block the whole group;
/// longer contexts take blocks of up to `attention::DECODE_SHARE_BLOCK`); in one split, in one
/// wide split (`AttnShape::decode_wide_takes`), and split over the context and combined. Over an
/// f16 cache with every block, an f32 one with the first and last (the cache type is an
/// include of its own, independent of the block).
fn attention_decode(ck: &mut Checker) -> Result<()> {
    let shapes = decode_attention_shapes(600);
    for (i, &shape) in shapes.iter().enumerate() {
        // The longest context one head per workgroup takes (in one split).
        let short = shape.decode_chunk();
        let f32_too = i == 0 || i + 1 == shapes.len();
        for f16_cache in [true, false].into_iter().take(1 + f32_too as usize) {
            let kv = KvKind::for_cache(f16_cache, &ck.ctx.caps);
            let mut r = Rng::new((shape.n_head * 64 + f16_cache as u32) as u64);
            let mut case = AttnCase::new(ck.ctx, shape, kv, &mut r)?;
            // Just past one split a head a workgroup takes the wide workgroups where the
            // adapter runs them (`AttnShape::decode_wide_takes`); past those, the split.
            let wide_chunk = shape.decode_wide_chunk();
            let lens =
                [(5, 1), (short, shape.group()), (short + 1, 1), (wide_chunk + 1, 1), (shape.n_ctx, shape.group())];
            for (kv_len, block) in lens {
                case.block = Some(block);
                let q = r.normal((shape.n_head * shape.head_dim) as usize, 2.0);
                let (got, dispatches) = case.decode(ck.ctx, &q, kv_len)?;
                let wide = shape.decode_wide_takes(&ck.ctx.caps, kv_len, block);
                let splits = if wide { 1 } else { shape.decode_splits(kv_len) };
                let what = format!(
                    "heads {} per KV head, block {block}, {kv:?}, {kv_len} positions in {splits}{} split{}",
                    shape.group(),
                    if wide { " wide" } else { "" },
                    if splits == 1 { "" } else { "s" }
                );
                let want_dispatches = shape.decode_dispatches(&ck.ctx.caps, kv_len, block);
                ck.expect(
                    format!("{what}: dispatches"),
                    dispatches == want_dispatches,
                    format!("{dispatches} dispatches, {want_dispatches} expected"),
                );
                ck.close(what.clone(), &got, &case.reference(&q, 1, kv_len as usize - 1), 1e-4);
                // The output also as the output projection's int8 blocks (`Caps::attn_q8_out`).
                let merged = splits > 1 && shape.decode_merges_at(&ck.ctx.caps, splits, false);
                decode_q8_output(ck, &case, &q, kv_len, &what, &got, merged)?;
            }
            ck.ran(1);
        }
    }
    Ok(())
}

/// Where the heads make whole int8 blocks: the decode attention `case` of query `q` at
/// `kv_len` positions also writing the output projection's int8 input gives blocks that
/// quantize its float output `got`, and the same float output to the bit, except where its
/// splits `merged` themselves: the merge then writes the blocks alone (common/decode_merge.wgsl's
/// `merge_write`), whose values may differ from `got` by rounding (it may share an output's
/// splits among fewer invocations where int8 blocks must stay within a subgroup,
/// `merge_groups`).
fn decode_q8_output(
    ck: &mut Checker,
    case: &AttnCase,
    q: &[f32],
    kv_len: u32,
    what: &str,
    got: &[f32],
    merged: bool,
) -> Result<()> {
    if !crate::kernels::attention::takes_q8_out(&case.shape) {
        return Ok(());
    }
    let (got8, blocks, _) = case.decode_q8(ck.ctx, q, kv_len)?;
    let blocks_ok = crate::doctor::matmul::check_q8_blocks(&blocks, got);
    let same = merged || got8 == got;
    ck.expect(
        format!("{what}: int8 output"),
        same && blocks_ok.is_ok(),
        match blocks_ok {
            Err(e) => e.to_string(),
            Ok(()) => "its float output differs".to_string(),
        },
    );
    Ok(())
}

/// One sequence's decode attention on cooperative matrices (long contexts' kernel), with
/// TinyLlama's heads and Llama-3-8B's (GQA groups of 8 and 4 at 64 and 128 dimensions), every
/// tile size, contexts of a tile and one key (a last tile moved back), several splits and the
/// longest; the output and the output projection's int8 blocks. Tolerance 5e-3 (Q and the
/// probabilities rounded to f16, as the matrix cores take them).
fn attention_decode_coop(ck: &mut Checker) -> Result<()> {
    use crate::kernels::attention::{self, AttnShape, CoopChoice};
    for (nh, nkv, hd) in [(32u32, 4u32, 64u32), (32, 8, 128)] {
        let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx: 1100 };
        let kv = KvKind::for_cache(true, &ck.ctx.caps);
        if !attention::decode_coop_takes(&ck.ctx.caps, kv, &shape, shape.n_ctx) {
            continue;
        }
        let mut r = Rng::new((nh * hd + nkv) as u64 + 991);
        let mut case = AttnCase::new(ck.ctx, shape, kv, &mut r)?;
        for keys in attention::DECODE_COOP_TILES {
            case.coop = CoopChoice::Always { keys: Some(keys) };
            for kv_len in [65, attention::DECODE_COOP_SUBGROUPS * keys * 3 + 1, shape.n_ctx] {
                let q = r.normal((nh * hd) as usize, 1.0);
                let (got, _) = case.decode(ck.ctx, &q, kv_len)?;
                let what = format!("heads {nh} / {nkv} KV of {hd}, tiles of {keys} keys, {kv_len} positions");
                ck.close(what.clone(), &got, &case.reference(&q, 1, kv_len as usize - 1), 5e-3);
                let splits = kv_len.div_ceil(attention::DECODE_COOP_SUBGROUPS * keys);
                decode_q8_output(
                    ck,
                    &case,
                    &q,
                    kv_len,
                    &what,
                    &got,
                    shape.decode_merges_at(&ck.ctx.caps, splits, true),
                )?;
            }
        }
        ck.ran(1);
    }
    Ok(())
}

/// A batched decode step's attention (`kiln serve`'s continuous batching): one query per
/// column, each over its own sequence's region of one shared cache (regions in another order
/// than the columns), at its own position, short and split contexts side by side; and the
/// single-sequence kernel over a region that does not start at row 0.
fn attention_decode_batched(ck: &mut Checker) -> Result<()> {
    use crate::kernels::attention::AttnShape;
    let region = 300u32;
    let cols = AttnCase::shared_cache_columns(region);
    // Small heads (GQA 2) and TinyLlama's (GQA 8, head dim 64).
    for (nh, nkv, hd) in [(8u32, 4u32, 8u32), (32, 4, 64)] {
        let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx: region * 5 };
        for f16_cache in [true, false] {
            let kv = KvKind::for_cache(f16_cache, &ck.ctx.caps);
            let mut r = Rng::new((nh * hd + nkv) as u64 + 77 + f16_cache as u64);
            let case = AttnCase::new(ck.ctx, shape, kv, &mut r)?;
            for m in [1usize, 2, 5] {
                let q = r.normal(m * (nh * hd) as usize, 2.0);
                let want: Vec<f32> =
                    cols[..m].iter().enumerate().flat_map(|(c, col)| case.reference_column(&q, c, col)).collect();
                let (got, _) = case.decode_columns(ck.ctx, &q, region, &cols[..m], true)?;
                ck.close(format!("{nh} heads, {nkv} KV heads, head dim {hd}, {kv:?}, {m} columns"), &got, &want, 1e-4);
            }
            let q = r.normal((nh * hd) as usize, 2.0);
            let (got, _) = case.decode_columns(ck.ctx, &q, region, &cols[2..3], false)?;
            let want = case.reference_column(&q, 0, &cols[2]);
            ck.close(format!("{nh} heads, {kv:?}, one sequence in a region"), &got, &want, 1e-4);
            ck.ran(2);
        }
    }
    Ok(())
}

/// The lowest index of each row's maximum: a single maximum, a tie, the last element, a flat row.
fn argmax_rows(ck: &mut Checker) -> Result<()> {
    let (rows, n) = (4usize, 32000usize);
    let mut x = Rng::new(11).normal(rows * n, 1.0);
    x[5] = 50.0;
    x[n + 100] = 9.0;
    x[n + 31999] = 9.0;
    x[2 * n + 31999] = 60.0;
    x[3 * n..].iter_mut().for_each(|v| *v = -1.0);
    let got = ops::argmax(ck.ctx, &x, rows, n)?;
    ck.tokens(format!("{rows}x{n}"), &got, &argmax::reference(&x, n));
    ck.ran(1);
    Ok(())
}

/// Each scored row's -log softmax at its target, with ragged rows, a stride wider than the
/// row, results written at an offset, and a logit whose exp() overflows f32.
fn nll_rows(ck: &mut Checker) -> Result<()> {
    for (rows, n, stride, row0, n_rows, out0) in
        [(5usize, 1000usize, 1003usize, 1u32, 3u32, 2u32), (9, 37, 40, 2, 7, 5)]
    {
        let mut r = Rng::new((n + rows) as u64);
        let mut logits = r.normal(rows * stride, 4.0);
        logits[stride + 3] = 95.0;
        let targets: Vec<u32> = (0..rows).map(|i| ((i * 7919 + 13) % n) as u32).collect();
        let p = NllParams { n: n as u32, stride: stride as u32, row0, n_rows, out0, _pad: [0; 3] };
        let len = (out0 + n_rows + 2) as usize;
        let got = ops::nll(ck.ctx, &logits, &targets, p, len)?;
        let mut want = vec![-1.0; len];
        want[out0 as usize..(out0 + n_rows) as usize].copy_from_slice(&nll::reference(&logits, &targets, &p));
        ck.close(format!("{rows}x{n} stride {stride}, rows {row0}..+{n_rows} at {out0}"), &got, &want, 2e-6);
    }
    ck.ran(1);
    Ok(())
}

/// Sampler settings that take every path of the sampler: greedy with and without the
/// penalties, llama.cpp's defaults, top-k, top-p and min-p each with a temperature, the
/// penalties while sampling.
pub fn sampler_configs() -> Vec<(&'static str, SamplerConfig)> {
    let greedy = SamplerConfig { temperature: 0.0, ..Default::default() };
    vec![
        ("greedy", greedy),
        (
            "greedy+penalties",
            SamplerConfig { repeat_penalty: 1.3, frequency_penalty: 0.5, presence_penalty: 0.4, ..greedy },
        ),
        ("defaults", SamplerConfig::default()),
        ("top-k 5, hot", SamplerConfig { top_k: 5, temperature: 1.5, top_p: 1.0, min_p: 0.0, ..Default::default() }),
        (
            "top-k off, top-p 0.9",
            SamplerConfig { top_k: 0, top_p: 0.9, min_p: 0.0, temperature: 1.0, ..Default::default() },
        ),
        (
            "min-p 0.2, cold",
            SamplerConfig { top_k: 100, top_p: 1.0, min_p: 0.2, temperature: 0.5, ..Default::default() },
        ),
        (
            "penalties",
            SamplerConfig {
                repeat_penalty: 1.2,
                repeat_last_n: 16,
                frequency_penalty: 0.3,
                presence_penalty: 0.2,
                ..Default::default()
            },
        ),
    ]
}

/// The GPU sampler picks the CPU reference's tokens: greedy, penalties, top-k, top-p, min-p
/// and temperature, through each way it finds its candidates: the threshold search done in
/// its first round (model-like logits), narrowed over several rounds (crowded logits),
/// every logit of a small vocabulary (top-k off on 1000), and the exact radix select (top-k
/// off on larger vocabularies).
fn sampler(ck: &mut Checker) -> Result<()> {
    let configs = sampler_configs();
    for (vocab, spread) in [(32000usize, 14.0f32), (1000, 0.5), (5000, 0.0)] {
        let mut r = Rng::new(vocab as u64);
        let logits = model_logits(&mut r, vocab, spread);
        let history: Vec<u32> = (0..40).map(|_| r.range(0, vocab as i64) as u32).collect();
        for (name, base) in &configs {
            let cfg = SamplerConfig { seed: 0x5eed_0000_0000_0000 + vocab as u64, ..*base };
            let got = ops::gpu_tokens(ck.ctx, &cfg, &logits, &history, 6)?;
            ck.tokens(
                format!("{name}, vocabulary {vocab}, spread {spread}"),
                &got,
                &ops::cpu_tokens(&cfg, &logits, &history, 6),
            );
        }
    }
    ck.ran(1);
    Ok(())
}

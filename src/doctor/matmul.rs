//! One matmul on the GPU with a chosen kernel, and what its CPU reference says it should
//! give: plain (bias, accumulation), with a fused input (RMSNorm, SiLU·up) and with a fused
//! epilogue (SwiGLU over interleaved rows; the stacked Q/K/V projection that rotates Q,
//! rotates K into the cache and copies V there). Plus the error bounds of the kernels that
//! round on purpose.

use crate::error::Result;
use crate::gpu::{run_dispatches, GpuContext, WeightTensor};
use crate::kernels::elementwise::{self, EltOp};
use crate::kernels::matmul::{self, Epilogue, Matmul, RopeShape, StepColumn, StepState};
use crate::kernels::{norm, KvKind};
use crate::plan::MatmulKernel;
use crate::quant::{dequantize, quantize, WeightFormat};

use super::data::{cache_values, pad_rows, MatmulCase};

/// What the matmul reads: X itself, or X through a fused RMSNorm or SiLU(X)·up.
#[derive(Debug, Clone)]
pub enum Input {
    Plain,
    Norm {
        gamma: Vec<f32>,
        eps: f32,
    },
    /// `up` is laid out as X.
    Glu {
        up: Vec<f32>,
    },
}

/// The stacked Q/K/V projection: the case's n rows are Q's, K's and V's, in that order.
#[derive(Debug, Clone, Copy)]
pub struct QkvShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub neox: bool,
    pub kv: KvKind,
    /// Position of the first token (the cache rows before it stay untouched).
    pub pos0: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// V's rows in a format of their own (Q4_K_M files store V in Q6_K): two matmuls as the
    /// engine runs them, the Q and K rows from row 0, the V rows from row q + kv, each
    /// binding a placeholder for the outputs its rows do not reach.
    pub v_format: Option<WeightFormat>,
    /// With `v_format`: both parts through one GEMV dispatch (`BoundMatmul::two_formats_in`,
    /// as one-token decode steps run them; one-column GEMV kernels only).
    pub one_dispatch: bool,
    /// The first cache row of the sequence's region (a slot of a shared cache).
    pub kv_base: usize,
    /// A batched decode step's epilogue: column r is its own sequence (`QkvShape::column`).
    pub batched: bool,
}

impl QkvShape {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
    pub fn rows(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
    /// Cache rows of each column's region in a batched step of m columns.
    fn region(&self, m: usize) -> usize {
        self.pos0 + 2 * m + 4
    }
    /// Column r of m: one sequence's token r at pos0 + r of the region at `kv_base`; batched,
    /// its own sequence, in slot m - 1 - r (the columns' order is not the regions'), at
    /// position pos0 + 2r.
    pub fn column(&self, r: usize, m: usize) -> StepColumn {
        let (pos, base, slot) = if self.batched {
            let slot = m - 1 - r;
            (self.pos0 + 2 * r, self.kv_base + slot * self.region(m), slot)
        } else {
            (self.pos0 + r, self.kv_base, 0)
        };
        StepColumn { pos: pos as u32, kv_len: pos as u32 + 1, kv_base: base as u32, slot: slot as u32 }
    }
    /// Cache rows the case needs.
    fn cache_rows(&self, m: usize) -> usize {
        if self.batched {
            self.kv_base + m * self.region(m)
        } else {
            self.kv_base + self.pos0 + m + 3
        }
    }
}

/// Where the outputs go.
#[derive(Debug, Clone, Copy)]
pub enum Epi {
    Plain,
    SwiGlu,
    /// SwiGLU, and (on the int8 GEMV's shapes over whole blocks) its int8 blocks for the down
    /// projection, checked against the SwiGLU values the kernel wrote (`check_q8_blocks`).
    SwiGluQ8,
    /// SwiGLU written as halves by the GEMMs (the down projection's f16 input), read back.
    SwiGluF16,
    /// Y (+ the residual), and (on the int8 GEMV's one-column shapes over whole blocks of 32
    /// rows) Y's int8 blocks times a next RMSNorm's weights with each block's sum of squares of
    /// Y, checked against the Y the kernel wrote (`check_q8_blocks`, `check_q8_sums_of_squares`).
    AddQ8Norm,
    Qkv(QkvShape),
}

/// One matmul to run.
#[derive(Debug, Clone)]
pub struct Run {
    pub kernel: MatmulKernel,
    pub bias: bool,
    /// Add into Y (plain epilogue only).
    pub accumulate: bool,
    pub input: Input,
    pub epi: Epi,
    /// A GEMM split into this many K ranges (split-K: partial sums, then the epilogue in a
    /// second pass); 1: not split.
    pub splits: u32,
    /// A GEMM over K-quant weights through an f16 copy of them decoded first (prefill's route
    /// on adapters with `Caps::dequant_f16_from`): the planner's GEMM for F16 weights over the
    /// copy, whatever `kernel` says.
    pub dequant: bool,
}

impl Run {
    pub fn plain(kernel: MatmulKernel, bias: bool, accumulate: bool) -> Run {
        Run { kernel, bias, accumulate, input: Input::Plain, epi: Epi::Plain, splits: 1, dequant: false }
    }
}

/// One output of a run beside its reference.
#[derive(Debug, Clone)]
pub struct Output {
    /// "y", "swiglu", or "q", "k", "v" of the Q/K/V epilogue.
    pub what: &'static str,
    pub got: Vec<f32>,
    pub want: Vec<f32>,
    /// Stored as f16 (a KV cache of halves): rounded on purpose.
    pub f16: bool,
}

/// A run's outputs and the activations the matmul really multiplied (after its fused
/// input), which the int8 GEMV's error bound is computed from.
pub struct Outcome {
    pub outputs: Vec<Output>,
    pub input: Vec<f32>,
}

/// Runs `run` over `c` on the GPU and computes its reference.
pub fn run(ctx: &GpuContext, c: &MatmulCase, run: &Run) -> Result<Outcome> {
    let (n, k, m) = (c.n, c.k, c.m);
    let (xp, xs) = c.x_padded();
    let x = ctx.upload_f32(&xp, "x")?;
    let input = match &run.input {
        Input::Plain => c.x.clone(),
        Input::Norm { gamma, eps } => norm::reference(&c.x, gamma, k, *eps),
        Input::Glu { up } => elementwise::reference(EltOp::SiluMul, &c.x, up),
    };
    let gamma = match &run.input {
        Input::Norm { gamma, .. } => Some(ctx.upload_f32(gamma, "norm")?),
        _ => None,
    };
    let up = match &run.input {
        Input::Glu { up } => Some(ctx.upload_f32(&pad_rows(up, m, k).0, "up")?),
        _ => None,
    };
    let norm = match (&run.input, &gamma) {
        (Input::Norm { eps, .. }, Some(g)) => Some((g, *eps)),
        _ => None,
    };
    let bias_values = if run.bias { Some(&c.bias[..]) } else { None };
    let plain = || matmul::reference(&c.w_ref, n, k, &input, m, bias_values, None);
    let mut outputs = Vec::new();
    match run.epi {
        Epi::Plain | Epi::AddQ8Norm => {
            let add_q8 = matches!(run.epi, Epi::AddQ8Norm);
            if add_q8 && m != 1 {
                return Err(crate::KilnError::invalid("check", "the int8 residual epilogue takes one column"));
            }
            let y = ctx.upload_f32(&c.y0, "y")?;
            let w = WeightTensor::upload(ctx, "w", c.format, n, k, &c.weights)?;
            let b = ctx.upload_f32(&c.bias, "bias")?;
            // The int8 residual epilogue's blocks and the weights of the norm the next GEMV
            // applies, which scale them (values of both signs and sizes).
            let next = match add_q8 {
                true => {
                    let gamma = super::data::Rng::new(n as u64 + 17).normal(n, 1.0);
                    let g = ctx.upload_f32(&gamma, "next norm")?;
                    let bytes = matmul::q8_input_bytes(1, n as u32).max(16);
                    Some((gamma, g, ctx.storage(bytes, "int8 residual output")?))
                }
                false => None,
            };
            let mm = Matmul {
                bias: run.bias.then_some(&b),
                x_stride: xs as u32,
                accumulate: run.accumulate,
                norm,
                glu: up.as_ref(),
                epi: match &next {
                    Some((_, g, blocks)) => Epilogue::PlainQ8Norm { blocks, norm_w: g },
                    None => Epilogue::Plain,
                },
                ..Matmul::dense(&w, &x, &y, m as u32)
            };
            dispatch(ctx, &mm, run)?;
            let want = match run.accumulate {
                true => plain().iter().zip(&c.y0).map(|(a, b)| (*a as f64 + *b as f64) as f32).collect(),
                false => plain(),
            };
            let got = ctx.read_f32(&y, m * n)?;
            if let Some((gamma, _, blocks)) = &next {
                let bytes = ctx.read_bytes(blocks, 0, matmul::q8_input_bytes(1, n as u32))?;
                let scaled: Vec<f32> = got.iter().zip(gamma).map(|(v, g)| v * g).collect();
                check_q8_blocks(&bytes, &scaled)?;
                check_q8_sums_of_squares(&bytes, &got)?;
            }
            outputs.push(Output { what: "y", got, want, f16: false });
        }
        Epi::SwiGlu | Epi::SwiGluQ8 | Epi::SwiGluF16 => {
            let y = ctx.storage((m * n / 2 * 4) as u64, "act")?;
            // The int8 blocks, or the halves, of the epilogues that write them as well or instead.
            let out = match run.epi {
                Epi::SwiGluQ8 => {
                    let bytes = matmul::q8_input_bytes(crate::plan::GEMV_MAX_COLS, (n / 2) as u32).max(16);
                    Some(ctx.storage(bytes, "int8 SwiGLU output")?)
                }
                Epi::SwiGluF16 if !matches!(run.kernel, MatmulKernel::Gemm { .. }) => {
                    return Err(crate::KilnError::invalid("check", "the f16 SwiGLU epilogue is the GEMMs'"));
                }
                Epi::SwiGluF16 => {
                    let bytes = ((xp.len() / xs).max(m) * n).next_multiple_of(16) as u64;
                    Some(ctx.storage(bytes, "f16 SwiGLU output")?)
                }
                _ => None,
            };
            let w = WeightTensor::upload(ctx, "gate_up", c.format, n, k, &c.weights)?;
            let b = ctx.upload_f32(&c.bias, "bias")?;
            let mm = Matmul {
                bias: run.bias.then_some(&b),
                x_stride: xs as u32,
                y_stride: (n / 2) as u32,
                norm,
                glu: up.as_ref(),
                epi: match (run.epi, &out) {
                    (Epi::SwiGluQ8, Some(blocks)) => Epilogue::SwiGluQ8 { blocks },
                    (Epi::SwiGluF16, Some(halves)) => Epilogue::SwiGluF16 { halves },
                    _ => Epilogue::SwiGlu,
                },
                ..Matmul::dense(&w, &x, &y, m as u32)
            };
            dispatch(ctx, &mm, run)?;
            let got = ctx.read_f32(&y, m * n / 2)?;
            let want = swiglu_reference(&plain(), m, n);
            match (run.epi, &out) {
                (Epi::SwiGluF16, Some(halves)) => {
                    // Only the halves are written.
                    let bytes = ctx.read_bytes(halves, 0, (m * n / 2 * 2).next_multiple_of(4) as u64)?;
                    let got = bytes.chunks_exact(2).take(m * n / 2);
                    let got = got.map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                    outputs.push(Output { what: "swiglu f16", got, want, f16: true });
                }
                (Epi::SwiGluQ8, Some(blocks)) => {
                    let bytes = ctx.read_bytes(blocks, 0, matmul::q8_input_bytes(m as u32, (n / 2) as u32))?;
                    check_q8_blocks(&bytes, &got)?;
                    outputs.push(Output { what: "swiglu", got, want, f16: false });
                }
                _ => outputs.push(Output { what: "swiglu", got, want, f16: false }),
            }
        }
        Epi::Qkv(s) => outputs = run_qkv(ctx, c, &s, &x, xs, norm, up.as_ref(), &input, bias_values, run)?,
    }
    Ok(Outcome { outputs, input })
}

fn dispatch(ctx: &GpuContext, mm: &Matmul, run: &Run) -> Result<()> {
    dispatch_columns(ctx, mm, run, false)
}

fn dispatch_columns(ctx: &GpuContext, mm: &Matmul, run: &Run, batched: bool) -> Result<()> {
    let ds = if run.dequant {
        matmul::prepare_dequant(ctx, mm, "doctor")?
    } else if run.splits > 1 {
        matmul::prepare_split(ctx, mm, run.kernel, run.splits, "doctor", batched)?
    } else {
        matmul::prepare_columns(ctx, mm, run.kernel, "doctor", batched)?
    };
    run_dispatches(ctx, &ds.iter().collect::<Vec<_>>())
}

/// The Q/K/V epilogue: the case's rows stacked as the engine stacks them (NeoX heads in the
/// order that puts rotated pairs side by side; V's rows requantized into a part of their own
/// where `s.v_format` says so), Q read back from Y, K and V from their caches at each
/// column's row (`QkvShape::column`). `input`: the activations the matmul multiplies (after
/// its fused input).
#[allow(clippy::too_many_arguments)]
fn run_qkv(
    ctx: &GpuContext,
    c: &MatmulCase,
    s: &QkvShape,
    x: &wgpu::Buffer,
    xs: usize,
    norm: Option<(&wgpu::Buffer, f32)>,
    up: Option<&wgpu::Buffer>,
    input: &[f32],
    bias_values: Option<&[f32]>,
    run: &Run,
) -> Result<Vec<Output>> {
    let (n, k, m) = (c.n, c.k, c.m);
    let (qd, kvd, hd) = (s.q_dim(), s.kv_dim(), s.head_dim);
    if n != s.rows() {
        return Err(crate::KilnError::invalid("check", format!("{n} rows are not Q, K and V's {}", s.rows())));
    }
    let n_ctx = s.cache_rows(m);
    let cols: Vec<StepColumn> = (0..m).map(|r| s.column(r, m)).collect();
    let elt = s.kv.bytes_per_elem() as usize;
    let (kc, vc) = (ctx.storage((n_ctx * kvd * elt) as u64, "k")?, ctx.storage((n_ctx * kvd * elt) as u64, "v")?);
    let q = ctx.storage((m * qd * 4) as u64, "q")?;
    let rope = ctx.uniform(
        &RopeShape {
            q_dim: qd as u32,
            kv_dim: kvd as u32,
            head_dim: hd as u32,
            n_rot: s.n_rot as u32,
            freq_base: s.freq_base,
            freq_scale: s.freq_scale,
            kv_stride: kvd as u32,
            _pad: 0,
        },
        "rope",
    );
    let step_bytes = if s.batched {
        matmul::step_table(&cols)
    } else {
        let (pos0, kv_len, kv_base) = (s.pos0 as u32, (s.pos0 + m) as u32, s.kv_base as u32);
        bytemuck::bytes_of(&StepState { n_tokens: m as u32, pos0, kv_len, kv_base }).to_vec()
    };
    let step = ctx.upload(&step_bytes, "step")?;
    // Row r of the stacked matrix holds plain row `src(r)`.
    let src = |r: usize| {
        if s.neox && r < qd + kvd {
            r - r % hd + crate::model::weights::neox_row(r % hd, s.n_rot)
        } else {
            r
        }
    };
    let rb = c.format.row_bytes(k).unwrap_or(0);
    let bias: Vec<f32> = (0..n).map(|r| c.bias[src(r)]).collect();
    let b = ctx.upload_f32(&bias, "bias")?;
    // The parts (first row, format, weights in it) and the weights' values in plain row order.
    let mut w_ref = c.w_ref.clone();
    let mut parts: Vec<(usize, WeightFormat, Vec<u8>)> = Vec::new();
    let qk_rows = if s.v_format.is_some() { qd + kvd } else { n };
    let rows = |a: usize, b: usize| (a..b).flat_map(|r| c.weights[src(r) * rb..(src(r) + 1) * rb].iter().copied());
    parts.push((0, c.format, rows(0, qk_rows).collect()));
    if let Some(vf) = s.v_format {
        let bad = |e: crate::quant::QuantError| crate::KilnError::invalid("check data", format!("V in {vf}: {e}"));
        let v_bytes = quantize(vf, &c.w_ref[qk_rows * k..]).map_err(bad)?;
        dequantize(vf, &v_bytes, (n - qk_rows) * k, &mut w_ref[qk_rows * k..]).map_err(bad)?;
        parts.push((qk_rows, vf, v_bytes));
    }
    let mut tensors = Vec::new();
    for (row_base, format, bytes) in &parts {
        let part_rows = bytes.len() / format.row_bytes(k).unwrap_or(1).max(1);
        tensors.push((*row_base, part_rows, WeightTensor::upload(ctx, "qkv part", *format, part_rows, k, bytes)?));
    }
    // Outputs a part's rows do not reach get a placeholder (as the engine binds them).
    let unused = tensors.iter().map(|_| ctx.storage(16, "unused output")).collect::<Result<Vec<_>>>()?;
    let qkv = |w, y, k_cache, v_cache, row_base: usize| Matmul {
        bias: run.bias.then_some(&b),
        x_stride: xs as u32,
        y_stride: qd as u32,
        norm,
        glu: up,
        epi: Epilogue::Qkv {
            k_cache,
            v_cache,
            kv: s.kv,
            neox: s.neox,
            rope: &rope,
            step: &step,
            row_base: row_base as u32,
        },
        ..Matmul::dense(w, x, y, m as u32)
    };
    if s.one_dispatch {
        let [(_, _, first), (_, _, second)] = &tensors[..] else {
            return Err(crate::KilnError::invalid(
                "check",
                "one dispatch over two formats needs V in a part of its own",
            ));
        };
        let ds = matmul::prepare_two_formats(ctx, &qkv(first, &q, &kc, &vc, 0), second, run.kernel, "doctor")?;
        run_dispatches(ctx, &ds.iter().collect::<Vec<_>>())?;
    } else {
        for ((row_base, part_rows, w), unused) in tensors.iter().zip(&unused) {
            let reaches = |from: usize, to: usize| *row_base < to && row_base + part_rows > from;
            let y = if reaches(0, qd) { &q } else { unused };
            let k_cache = if reaches(qd, qd + kvd) { &kc } else { unused };
            let v_cache = if reaches(qd + kvd, n) { &vc } else { unused };
            dispatch_columns(ctx, &qkv(w, y, k_cache, v_cache, *row_base), run, s.batched)?;
        }
    }
    let plain = matmul::reference(&w_ref, n, k, input, m, bias_values, None);
    let positions: Vec<usize> = cols.iter().map(|c| c.pos as usize).collect();
    let (want_q, want_k, want_v) = qkv_reference(&plain, &positions, s);
    // Each column's cache row.
    let cache_rows = |buf: &wgpu::Buffer| -> Result<Vec<f32>> {
        let mut v = Vec::new();
        for c in &cols {
            let row = (c.kv_base + c.pos) as usize;
            let bytes = ctx.read_bytes(buf, (row * kvd * elt) as u64, (kvd * elt) as u64)?;
            v.extend(cache_values(&bytes, s.kv));
        }
        Ok(v)
    };
    let f16 = s.kv != KvKind::F32;
    Ok(vec![
        Output { what: "q", got: ctx.read_f32(&q, m * qd)?, want: want_q, f16: false },
        Output { what: "k", got: cache_rows(&kc)?, want: want_k, f16 },
        Output { what: "v", got: cache_rows(&vc)?, want: want_v, f16 },
    ])
}

/// Y = silu(gate) * up of interleaved gate/up rows (2i, 2i + 1), as SwiGLU's epilogue writes it.
/// Whether `bytes`, int8 blocks as quantize_q8.wgsl lays them out (per 32 values: quants 0-15,
/// 16-31, then d and the two halves' sums of d * q), quantize `values`: d within 1e-6 of
/// max |x| / 127, every d * q within d / 2 of its value (a thousandth of d of slack for the
/// GPU's reciprocal), the sums those of the quants.
pub fn check_q8_blocks(bytes: &[u8], values: &[f32]) -> Result<()> {
    let bad = |what: String| Err(crate::KilnError::invalid("int8 blocks", what));
    if bytes.len() != values.len() / 32 * 48 || values.len() % 32 != 0 {
        return bad(format!("{} bytes for {} values", bytes.len(), values.len()));
    }
    for (b, (block, xs)) in bytes.chunks(48).zip(values.chunks(32)).enumerate() {
        let f = |i: usize| f32::from_le_bytes(block[32 + 4 * i..36 + 4 * i].try_into().expect("4 bytes"));
        let (d, sums) = (f(0), [f(1), f(2)]);
        let amax = xs.iter().fold(0f32, |a, x| a.max(x.abs()));
        if (d - amax / 127.0).abs() > 1e-6 * amax / 127.0 + f32::MIN_POSITIVE {
            return bad(format!("block {b}: d {d}, max |x| / 127 {}", amax / 127.0));
        }
        for half in 0..2 {
            let q = &block[16 * half..16 * half + 16];
            let mut sum = 0f64;
            for (j, &qb) in q.iter().enumerate() {
                let (v, x) = (d * (qb as i8) as f32, xs[16 * half + j]);
                if (v - x).abs() > 0.501 * d + f32::MIN_POSITIVE {
                    return bad(format!("block {b}, value {}: {x} quantized to {v} (d {d})", 16 * half + j));
                }
                sum += v as f64;
            }
            if (sums[half] as f64 - sum).abs() > 1e-5 * (16.0 * 127.0 * d as f64) {
                return bad(format!("block {b}, half {half}: sum {} of quants summing to {sum}", sums[half]));
            }
        }
    }
    Ok(())
}

/// Whether each of `bytes`' int8 blocks (as `check_q8_blocks` reads them) holds in its sums'
/// last slot the sum of squares of its 32 `values` (the unscaled ones: quantize_q8_lanes.wgsl's
/// layout through an RMSNorm), within 1e-5 of it.
pub fn check_q8_sums_of_squares(bytes: &[u8], values: &[f32]) -> Result<()> {
    if bytes.len() != values.len() / 32 * 48 || values.len() % 32 != 0 {
        return Err(crate::KilnError::invalid(
            "int8 blocks",
            format!("{} bytes for {} values", bytes.len(), values.len()),
        ));
    }
    for (b, (block, xs)) in bytes.chunks(48).zip(values.chunks(32)).enumerate() {
        let got = f32::from_le_bytes(block[44..48].try_into().expect("4 bytes")) as f64;
        let want: f64 = xs.iter().map(|&x| x as f64 * x as f64).sum();
        if (got - want).abs() > 1e-5 * want.max(f32::MIN_POSITIVE as f64) {
            return Err(crate::KilnError::invalid(
                "int8 blocks",
                format!("block {b}: sum of squares {got}, want {want}"),
            ));
        }
    }
    Ok(())
}

pub fn swiglu_reference(y: &[f32], m: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n / 2];
    for r in 0..m {
        for i in 0..n / 2 {
            let (g, u) = (y[r * n + 2 * i] as f64, y[r * n + 2 * i + 1] as f64);
            out[r * n / 2 + i] = (g / (1.0 + (-g).exp()) * u) as f32;
        }
    }
    out
}

/// What the Q/K/V epilogue writes, from the plain product [m, q + 2 kv] (in plain row order):
/// each column's Q and K heads rotated at its position (`positions[r]`), V as it is.
pub fn qkv_reference(plain: &[f32], positions: &[usize], s: &QkvShape) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let m = positions.len();
    let (qd, kvd, hd, n) = (s.q_dim(), s.kv_dim(), s.head_dim, s.rows());
    let rotate = |v: &[f32], pos: usize| -> Vec<f32> {
        let mut o = v.to_vec();
        for i in 0..s.n_rot / 2 {
            let (a, b) = if s.neox { (i, i + s.n_rot / 2) } else { (2 * i, 2 * i + 1) };
            let th = pos as f64 * s.freq_scale as f64 * (s.freq_base as f64).powf(-2.0 * i as f64 / s.n_rot as f64);
            let (x0, x1) = (v[a] as f64, v[b] as f64);
            o[a] = (x0 * th.cos() - x1 * th.sin()) as f32;
            o[b] = (x0 * th.sin() + x1 * th.cos()) as f32;
        }
        o
    };
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..m {
        let row = &plain[r * n..(r + 1) * n];
        for h in 0..s.n_head {
            q.extend(rotate(&row[h * hd..(h + 1) * hd], positions[r]));
        }
        for h in 0..s.n_kv_head {
            k.extend(rotate(&row[qd + h * hd..qd + (h + 1) * hd], positions[r]));
        }
        v.extend_from_slice(&row[qd + kvd..]);
    }
    (q, k, v)
}

/// The int8 GEMV's error bound for arbitrary activations: each x value rounds by at most
/// half its block's step (max |x| / 127 / 2), so |Δy[m, n]| <= sum_k |w[n, k]| step(k) / 2.
pub fn q8_bound(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
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

/// The cooperative-matrix GEMM's error bound: activations and weights are rounded to f16, so
/// each element is held to 2^-10 sum |w x| (two roundings of at most 2^-11 each), plus 2^-25
/// per value for f16's subnormal range.
pub fn coop_bound(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| {
            let (xr, wr) = (&x[(i / n) * k..][..k], &w[(i % n) * k..][..k]);
            xr.iter().zip(wr).map(|(a, b)| (a * b).abs() / 1024.0 + (a.abs() + b.abs()) / 33554432.0).sum::<f32>()
                * 1.01
        })
        .collect()
}

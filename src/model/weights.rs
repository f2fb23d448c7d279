//! Model weights on the GPU: matrices stay in their GGUF block format; norm weights and
//! biases become f32 vectors. Uploaded once.

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use crate::gpu::{GpuContext, WeightTensor};
use crate::model::config::{Arch, ModelConfig};
use crate::quant::dequantize;

/// Which dimension of a head row e of a NeoX-ordered Q or K matrix holds: the rotated pairs
/// (i, i + n_rot/2) sit at rows 2i and 2i + 1; dimensions past n_rot stay in place.
pub fn neox_row(e: usize, n_rot: usize) -> usize {
    if e >= n_rot {
        e
    } else if e % 2 == 0 {
        e / 2
    } else {
        e / 2 + n_rot / 2
    }
}

pub struct LayerWeights {
    pub attn_norm: wgpu::Buffer,
    pub qkv: Qkv,
    pub wo: WeightTensor,
    pub ffn_norm: wgpu::Buffer,
    pub ffn: GateUp,
    pub w_down: WeightTensor,
}

impl LayerWeights {
    /// The layer's weight matrices.
    pub fn matrices(&self) -> Vec<&WeightTensor> {
        let mut m = match &self.qkv {
            Qkv::Stacked { parts, .. } => parts.iter().map(|p| &p.w).collect(),
            Qkv::Separate { wq, wk, wv, .. } => vec![wq, wk, wv],
        };
        match &self.ffn {
            GateUp::Interleaved(w) => m.push(w),
            GateUp::Separate { w_gate, w_up } => m.extend([w_gate, w_up]),
        }
        m.extend([&self.wo, &self.w_down]);
        m
    }
}

/// The attention's Q, K and V projections. Loaded once a layer and never moved after, so its
/// variants' sizes do not matter (clippy's large_enum_variant).
#[allow(clippy::large_enum_variant)]
pub enum Qkv {
    /// The rows of Q, K and V stacked as one matrix [q_dim + 2 kv_dim, n_embd], stored as
    /// parts of one format each (Q4_K_M files keep V in Q6_K in some layers: then Q+K and V):
    /// every part is one matmul whose epilogue rotates Q and K and writes K and V into the KV
    /// cache. For NeoX RoPE the Q and K rows of each head are reordered so that each rotated
    /// pair (i, i + n_rot/2) is adjacent. `bias` (Qwen2) in the same row order.
    Stacked { parts: Vec<QkvPart>, bias: Option<wgpu::Buffer> },
    /// Separate matrices, rotated and written to the cache by their own kernels: Qwen3 (a
    /// per-head RMSNorm comes between projection and rotation), and NeoX models on adapters
    /// without f16 shaders (a packed-f16 cache word cannot take half of a rotated pair).
    Separate {
        wq: WeightTensor,
        wk: WeightTensor,
        wv: WeightTensor,
        /// Qwen2's Q/K/V biases.
        bq: Option<wgpu::Buffer>,
        bk: Option<wgpu::Buffer>,
        bv: Option<wgpu::Buffer>,
        /// Qwen3's per-head Q/K norms.
        q_norm: Option<wgpu::Buffer>,
        k_norm: Option<wgpu::Buffer>,
    },
}

/// Rows `[row_base, row_base + w.rows)` of the stacked Q/K/V matrix.
pub struct QkvPart {
    pub w: WeightTensor,
    pub row_base: u32,
}

/// The feed-forward gate and up projections.
pub enum GateUp {
    /// Gate and up rows interleaved (2i = gate_i, 2i + 1 = up_i) in one matrix whose
    /// epilogue writes silu(gate) * up.
    Interleaved(WeightTensor),
    /// Apart (their formats differ): the down projection applies SwiGLU to its input.
    Separate { w_gate: WeightTensor, w_up: WeightTensor },
}

pub struct Weights {
    pub token_embd: WeightTensor,
    pub output_norm: wgpu::Buffer,
    /// None: tied to token_embd.
    pub output: Option<WeightTensor>,
    pub layers: Vec<LayerWeights>,
    /// Bytes uploaded.
    pub bytes: u64,
}

struct Loader<'a> {
    ctx: &'a GpuContext,
    /// False: allocate the matrices without writing them (`Weights::allocate`).
    write: bool,
    file: &'a GgufFile,
    bytes: u64,
    progress: &'a mut dyn FnMut(u64),
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&crate::gguf::TensorInfo> {
        self.file.tensor(name).ok_or_else(|| KilnError::File {
            path: self.file.path.clone(),
            message: format!("tensor {name} is missing"),
        })
    }

    fn format(&self, name: &str) -> Result<crate::quant::WeightFormat> {
        let t = self.info(name)?;
        t.format.ok_or_else(|| KilnError::File {
            path: self.file.path.clone(),
            message: format!("tensor {name} has unsupported type {}", t.type_name()),
        })
    }

    /// One matrix made of rows of several tensors of one format: `rows` lists (tensor, row)
    /// in the order the matrix holds them.
    fn stacked(&mut self, label: &str, names: &[String], rows: &[(usize, usize)]) -> Result<WeightTensor> {
        let infos = names.iter().map(|n| self.info(n).cloned()).collect::<Result<Vec<_>>>()?;
        let format = self.format(&names[0])?;
        let k = infos[0].rows_k().1;
        let datas: Vec<&[u8]> = infos.iter().map(|t| self.file.tensor_data(t)).collect();
        let row_bytes = format.row_bytes(k).unwrap_or(0);
        let row = |r: usize| {
            let (t, i) = rows[r];
            &datas[t][i * row_bytes..(i + 1) * row_bytes]
        };
        let w = if self.write {
            WeightTensor::upload_rows_deferred(self.ctx, label, format, rows.len(), k, &row)?
        } else {
            WeightTensor::allocate(self.ctx, label, format, rows.len(), k)?
        };
        if self.write {
            for t in &infos {
                self.file.release_tensor_data(t);
            }
        }
        self.bytes += infos.iter().map(|t| t.bytes).sum::<u64>();
        (self.progress)(self.bytes);
        Ok(w)
    }

    fn matrix(&mut self, name: &str) -> Result<WeightTensor> {
        let t = self.info(name)?.clone();
        let format = self.format(name)?;
        let (rows, k) = t.rows_k();
        if !self.write {
            return WeightTensor::allocate(self.ctx, name, format, rows, k);
        }
        let w = WeightTensor::upload_deferred(self.ctx, name, format, rows, k, self.file.tensor_data(&t))?;
        // The bytes are in staging memory now: the file's pages can go.
        self.file.release_tensor_data(&t);
        self.bytes += t.bytes;
        (self.progress)(self.bytes);
        Ok(w)
    }

    fn vector(&mut self, name: &str) -> Result<wgpu::Buffer> {
        let t = self.info(name)?.clone();
        let format = t.format.ok_or_else(|| KilnError::File {
            path: self.file.path.clone(),
            message: format!("tensor {name} has unsupported type {}", t.type_name()),
        })?;
        let n = t.n_elements() as usize;
        let mut v = vec![0f32; n];
        dequantize(format, self.file.tensor_data(&t), n, &mut v)?;
        self.bytes += t.bytes;
        self.ctx.upload_f32(&v, name)
    }

    /// Layer i's Q, K and V projections: stacked where the epilogue can rotate them
    /// (`Qkv::Stacked`), else apart.
    fn qkv(&mut self, cfg: &ModelConfig, i: u32) -> Result<Qkv> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let names = [n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight")];
        let qwen2 = cfg.arch == Arch::Qwen2;
        let neox = cfg.rope_mode == crate::kernels::rope::RopeMode::Neox;
        if cfg.arch == Arch::Qwen3 || (neox && !self.ctx.caps.f16) {
            return Ok(Qkv::Separate {
                wq: self.matrix(&names[0])?,
                wk: self.matrix(&names[1])?,
                wv: self.matrix(&names[2])?,
                bq: self.opt_vector(&n("attn_q.bias"), qwen2)?,
                bk: self.opt_vector(&n("attn_k.bias"), qwen2)?,
                bv: self.opt_vector(&n("attn_v.bias"), qwen2)?,
                q_norm: self.opt_vector(&n("attn_q_norm.weight"), cfg.arch == Arch::Qwen3)?,
                k_norm: self.opt_vector(&n("attn_k_norm.weight"), cfg.arch == Arch::Qwen3)?,
            });
        }
        // Rows of the stacked matrix as (tensor, row): Q, K (each head in rotation-pair order
        // for NeoX), V.
        let (hd, n_rot) = (cfg.head_dim as usize, cfg.n_rot as usize);
        let order = |rows: usize, t: usize| -> Vec<(usize, usize)> {
            (0..rows).map(|r| (t, if neox { r - r % hd + neox_row(r % hd, n_rot) } else { r })).collect()
        };
        let mut rows = order(cfg.q_dim() as usize, 0);
        rows.extend(order(cfg.kv_dim() as usize, 1));
        rows.extend((0..cfg.kv_dim() as usize).map(|r| (2, r)));
        let bias = if qwen2 {
            let b = names.iter().map(|m| m.replace(".weight", ".bias")).collect::<Vec<_>>();
            let vals = b.iter().map(|m| self.values(m)).collect::<Result<Vec<_>>>()?;
            let stacked: Vec<f32> = rows.iter().map(|&(t, r)| vals[t][r]).collect();
            Some(self.ctx.upload_f32(&stacked, &n("attn_qkv.bias"))?)
        } else {
            None
        };
        // Parts: runs of consecutive tensors of one format.
        let formats = names.iter().map(|m| self.format(m)).collect::<Result<Vec<_>>>()?;
        let mut parts = Vec::new();
        let mut t0 = 0;
        while t0 < 3 {
            let mut t1 = t0 + 1;
            while t1 < 3 && formats[t1] == formats[t0] {
                t1 += 1;
            }
            let first = rows.iter().position(|&(t, _)| t == t0).unwrap_or(0);
            let last = rows.iter().rposition(|&(t, _)| t == t1 - 1).map(|x| x + 1).unwrap_or(rows.len());
            // Rows of this part, renumbered to the part's own tensor list.
            let part_rows: Vec<(usize, usize)> = rows[first..last].iter().map(|&(t, r)| (t - t0, r)).collect();
            let label = ["q", "qk", "qkv", "k", "kv", "v"][match (t0, t1) {
                (0, 1) => 0,
                (0, 2) => 1,
                (0, 3) => 2,
                (1, 2) => 3,
                (1, 3) => 4,
                _ => 5,
            }];
            let w = self.stacked(&n(&format!("attn_{label}")), &names[t0..t1], &part_rows)?;
            parts.push(QkvPart { w, row_base: first as u32 });
            t0 = t1;
        }
        Ok(Qkv::Stacked { parts, bias })
    }

    /// A vector's values as f32 (norms, biases).
    fn values(&mut self, name: &str) -> Result<Vec<f32>> {
        let t = self.info(name)?.clone();
        let format = self.format(name)?;
        let n = t.n_elements() as usize;
        let mut v = vec![0f32; n];
        dequantize(format, self.file.tensor_data(&t), n, &mut v)?;
        self.bytes += t.bytes;
        Ok(v)
    }

    fn opt_vector(&mut self, name: &str, want: bool) -> Result<Option<wgpu::Buffer>> {
        if want {
            self.vector(name).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Weights {
    /// Uploads every weight; `progress` is told the bytes uploaded so far.
    pub fn upload(
        ctx: &GpuContext,
        file: &GgufFile,
        cfg: &ModelConfig,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Weights> {
        file.will_read_tensors();
        Self::load(ctx, file, cfg, true, progress)
    }

    /// Every weight buffer, the matrices left unwritten (the norms and biases are small and
    /// written): a model whose shapes, formats and buffer splits are real but which costs no
    /// copying, for checking what fits an adapter.
    pub fn allocate(ctx: &GpuContext, file: &GgufFile, cfg: &ModelConfig) -> Result<Weights> {
        Self::load(ctx, file, cfg, false, &mut |_| {})
    }

    fn load(
        ctx: &GpuContext,
        file: &GgufFile,
        cfg: &ModelConfig,
        write: bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Weights> {
        cfg.validate_tensors(file)?;
        let mut l = Loader { ctx, file, write, bytes: 0, progress };
        let token_embd = l.matrix("token_embd.weight")?;
        let output_norm = l.vector("output_norm.weight")?;
        let output = if cfg.tied_embeddings { None } else { Some(l.matrix("output.weight")?) };
        let mut layers = Vec::with_capacity(cfg.n_layer as usize);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let attn_norm = l.vector(&n("attn_norm.weight"))?;
            let qkv = l.qkv(cfg, i)?;
            let wo = l.matrix(&n("attn_output.weight"))?;
            let ffn_norm = l.vector(&n("ffn_norm.weight"))?;
            let (gate, up) = (n("ffn_gate.weight"), n("ffn_up.weight"));
            let ffn = if l.format(&gate)? == l.format(&up)? {
                let n_ff = cfg.n_ff as usize;
                let rows: Vec<(usize, usize)> = (0..2 * n_ff).map(|r| (r % 2, r / 2)).collect();
                GateUp::Interleaved(l.stacked(&n("ffn_gate_up"), &[gate, up], &rows)?)
            } else {
                GateUp::Separate { w_gate: l.matrix(&gate)?, w_up: l.matrix(&up)? }
            };
            let w_down = l.matrix(&n("ffn_down.weight"))?;
            layers.push(LayerWeights { attn_norm, qkv, wo, ffn_norm, ffn, w_down });
        }
        Ok(Weights { token_embd, output_norm, output, layers, bytes: l.bytes })
    }

    pub fn lm_head(&self) -> &WeightTensor {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

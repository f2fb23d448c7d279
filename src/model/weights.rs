//! Model weights on the GPU: matrices stay in their GGUF block format; norm weights and
//! biases become f32 vectors. Uploaded once.

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use crate::gpu::{GpuContext, WeightTensor};
use crate::model::config::{Arch, ModelConfig};
use crate::quant::dequantize;

pub struct LayerWeights {
    pub attn_norm: wgpu::Buffer,
    pub wq: WeightTensor,
    pub wk: WeightTensor,
    pub wv: WeightTensor,
    /// Qwen2's Q/K/V biases.
    pub bq: Option<wgpu::Buffer>,
    pub bk: Option<wgpu::Buffer>,
    pub bv: Option<wgpu::Buffer>,
    /// Qwen3's per-head Q/K norms.
    pub q_norm: Option<wgpu::Buffer>,
    pub k_norm: Option<wgpu::Buffer>,
    pub wo: WeightTensor,
    pub ffn_norm: wgpu::Buffer,
    pub w_gate: WeightTensor,
    pub w_up: WeightTensor,
    pub w_down: WeightTensor,
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

    fn matrix(&mut self, name: &str) -> Result<WeightTensor> {
        let t = self.info(name)?.clone();
        let format = t.format.ok_or_else(|| KilnError::File {
            path: self.file.path.clone(),
            message: format!("tensor {name} has unsupported type {}", t.type_name()),
        })?;
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
            let qwen2 = cfg.arch == Arch::Qwen2;
            let qwen3 = cfg.arch == Arch::Qwen3;
            layers.push(LayerWeights {
                attn_norm: l.vector(&n("attn_norm.weight"))?,
                wq: l.matrix(&n("attn_q.weight"))?,
                wk: l.matrix(&n("attn_k.weight"))?,
                wv: l.matrix(&n("attn_v.weight"))?,
                bq: l.opt_vector(&n("attn_q.bias"), qwen2)?,
                bk: l.opt_vector(&n("attn_k.bias"), qwen2)?,
                bv: l.opt_vector(&n("attn_v.bias"), qwen2)?,
                q_norm: l.opt_vector(&n("attn_q_norm.weight"), qwen3)?,
                k_norm: l.opt_vector(&n("attn_k_norm.weight"), qwen3)?,
                wo: l.matrix(&n("attn_output.weight"))?,
                ffn_norm: l.vector(&n("ffn_norm.weight"))?,
                w_gate: l.matrix(&n("ffn_gate.weight"))?,
                w_up: l.matrix(&n("ffn_up.weight"))?,
                w_down: l.matrix(&n("ffn_down.weight"))?,
            });
        }
        Ok(Weights { token_embd, output_norm, output, layers, bytes: l.bytes })
    }

    pub fn lm_head(&self) -> &WeightTensor {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

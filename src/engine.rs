//! The library's front door: load a model onto a GPU and open sessions on it.

use std::path::Path;
use std::sync::Arc;

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::model::{ModelConfig, Session, SessionOptions, Weights};

pub struct Model {
    pub ctx: Arc<GpuContext>,
    pub file: GgufFile,
    pub cfg: ModelConfig,
    pub weights: Arc<Weights>,
    /// GPU memory the weights took (wgpu's count of buffer memory, before and after upload).
    pub weight_gpu_bytes: u64,
    /// Seconds from the file's bytes to weights ready on the GPU (every copy done).
    pub load_secs: f64,
}

const MIB: f64 = (1 << 20) as f64;

/// ", of N MiB" where the adapter reports its memory.
fn available_note(ctx: &GpuContext) -> String {
    match ctx.device_memory {
        Some(m) => format!(", of the {:.1} MiB the adapter has", m as f64 / MIB),
        None => String::new(),
    }
}

/// Bytes of GPU memory the weights of `cfg` take once uploaded (matrices in their GPU block
/// layout, norm weights and biases as f32).
pub fn weight_gpu_bytes(file: &GgufFile, cfg: &ModelConfig) -> u64 {
    cfg.expected_tensors()
        .iter()
        .filter_map(|(name, rows, k)| {
            let t = file.tensor(name)?;
            let vector = name.ends_with("norm.weight") || name.ends_with(".bias");
            if vector {
                Some(t.n_elements() * 4)
            } else {
                t.format.and_then(|f| f.gpu_tensor_bytes(*rows, *k)).map(|b| b as u64)
            }
        })
        .sum()
}

impl Model {
    /// Opens and validates `path`, then uploads its weights (`progress` gets bytes uploaded).
    pub fn load(ctx: Arc<GpuContext>, path: impl AsRef<Path>, progress: &mut dyn FnMut(u64)) -> Result<Model> {
        let (file, cfg) = Self::check(path)?;
        Self::upload(ctx, file, cfg, progress)
    }

    /// Validates an opened GGUF image (a file, or a synthetic model built in memory) and
    /// uploads its weights.
    pub fn load_file(ctx: Arc<GpuContext>, file: GgufFile, progress: &mut dyn FnMut(u64)) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(&file)?;
        cfg.validate_tensors(&file)?;
        Self::upload(ctx, file, cfg, progress)
    }

    /// A checked model whose matrices are allocated on the GPU but never written (every buffer
    /// and binding as `upload` makes them, no copying): tests of what fits an adapter.
    pub fn allocate(ctx: Arc<GpuContext>, file: GgufFile) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(&file)?;
        let t = std::time::Instant::now();
        let before = ctx.buffers_alive().bytes;
        let weights = ctx.capture("allocating the weights", "the adapter ran out of memory", "", || {
            let w = Weights::allocate(&ctx, &file, &cfg)?;
            ctx.finish_uploads()?;
            Ok(w)
        })?;
        let weight_gpu_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
        let load_secs = t.elapsed().as_secs_f64();
        Ok(Model { ctx, file, cfg, weights: Arc::new(weights), weight_gpu_bytes, load_secs })
    }

    /// Opens `path` and checks everything that needs no GPU: the file's structure, the model
    /// configuration, and every tensor the forward pass reads.
    pub fn check(path: impl AsRef<Path>) -> Result<(GgufFile, ModelConfig)> {
        let file = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&file)?;
        cfg.validate_tensors(&file)?;
        Ok((file, cfg))
    }

    /// Uploads a checked model. A model whose weights exceed the adapter's memory (where the
    /// driver reports it) is refused before anything is uploaded.
    pub fn upload(
        ctx: Arc<GpuContext>,
        file: GgufFile,
        cfg: ModelConfig,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Model> {
        let needed = weight_gpu_bytes(&file, &cfg);
        if let Some(available) = ctx.device_memory {
            if needed > available {
                return Err(KilnError::OutOfMemory {
                    what: format!("the weights of {}", file.path.display()),
                    needed,
                    available,
                    hint: "use a smaller or more quantized model".into(),
                });
            }
        }
        let t = std::time::Instant::now();
        let before = ctx.buffers_alive().bytes;
        let what = format!("uploading {}", file.path.display());
        let oom_hint = format!(
            "the adapter has no room for the model's {:.1} MiB of weights{}; use a smaller or more quantized model",
            needed as f64 / MIB,
            available_note(&ctx)
        );
        let weights = ctx.capture(&what, &oom_hint, "", || {
            let w = Weights::upload(&ctx, &file, &cfg, progress)?;
            // Every write reaches the GPU and its staging memory is released before the
            // session allocates.
            ctx.finish_uploads()?;
            Ok(w)
        })?;
        let weight_gpu_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
        let load_secs = t.elapsed().as_secs_f64();
        Ok(Model { ctx, file, cfg, weights: Arc::new(weights), weight_gpu_bytes, load_secs })
    }

    /// A session. The ubatch is lowered where a buffer would not fit the adapter's binding
    /// limit (`model::fit_session`); out-of-memory and validation errors while allocating
    /// become one error naming the context size.
    pub fn session(&self, opts: SessionOptions) -> Result<Session> {
        let opts = crate::model::fit_session(&self.ctx, &self.cfg, opts)?;
        let sizes = crate::model::SessionSizes::new(&self.cfg, &opts, &self.ctx.caps);
        let oom = format!(
            "the adapter has no room for a context of {} tokens ({:.1} MiB of KV cache and {:.1} MiB of activations beside {:.1} MiB of weights{}); lower -c (or --ubatch)",
            opts.n_ctx,
            sizes.kv_bytes() as f64 / MIB,
            sizes.activation_bytes() as f64 / MIB,
            self.weight_gpu_bytes as f64 / MIB,
            available_note(&self.ctx)
        );
        let hint = format!("lower -c (now {}) or --ubatch (now {})", opts.n_ctx, opts.ubatch);
        self.ctx.capture("allocating the KV cache and activations", &oom, &hint, || {
            Session::new(self.ctx.clone(), &self.cfg, self.weights.clone(), opts)
        })
    }
}

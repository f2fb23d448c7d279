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
}

const MIB: f64 = (1 << 20) as f64;

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
        let before = ctx.buffers_alive().bytes;
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let weights = Weights::upload(&ctx, &file, &cfg, progress);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(KilnError::Gpu {
                context: format!("uploading {}", file.path.display()),
                message: format!(
                    "the adapter ran out of memory for the model's {:.1} MiB of weights ({e}); try a smaller or more quantized model",
                    needed as f64 / MIB
                ),
            });
        }
        let weights = weights?;
        let weight_gpu_bytes = ctx.buffers_alive().bytes.saturating_sub(before);
        Ok(Model { ctx, file, cfg, weights: Arc::new(weights), weight_gpu_bytes })
    }

    /// A session; an out-of-memory adapter becomes an error naming the context size.
    pub fn session(&self, opts: SessionOptions) -> Result<Session> {
        let scope = self.ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let session = Session::new(self.ctx.clone(), &self.cfg, self.weights.clone(), opts);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(KilnError::Gpu {
                context: "allocating the KV cache and activations".into(),
                message: format!(
                    "the adapter ran out of memory for a context of {} tokens ({e}); lower -c",
                    opts.n_ctx
                ),
            });
        }
        session
    }
}

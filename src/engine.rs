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
}

impl Model {
    /// Opens and validates `path`, then uploads its weights (`progress` gets bytes uploaded).
    pub fn load(ctx: Arc<GpuContext>, path: impl AsRef<Path>, progress: &mut dyn FnMut(u64)) -> Result<Model> {
        Self::load_file(ctx, GgufFile::open(path)?, progress)
    }

    /// Validates an opened GGUF image (a file, or a synthetic model built in memory) and
    /// uploads its weights.
    pub fn load_file(ctx: Arc<GpuContext>, file: GgufFile, progress: &mut dyn FnMut(u64)) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(&file)?;
        cfg.validate_tensors(&file)?;
        let needed: u64 = file.tensors.iter().map(|t| t.bytes).sum();
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let weights = Weights::upload(&ctx, &file, &cfg, progress);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(KilnError::Gpu {
                context: format!("uploading {}", file.path.display()),
                message: format!("the adapter ran out of memory for the model's {:.1} MiB of weights ({e}); try a smaller or more quantized model", needed as f64 / (1 << 20) as f64),
            });
        }
        Ok(Model { ctx, file, cfg, weights: Arc::new(weights?) })
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

//! The library's front door: load a model onto a GPU and open sessions on it.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
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
        let file = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&file)?;
        cfg.validate_tensors(&file)?;
        let weights = Arc::new(Weights::upload(&ctx, &file, &cfg, progress)?);
        Ok(Model { ctx, file, cfg, weights })
    }

    pub fn session(&self, opts: SessionOptions) -> Result<Session> {
        Session::new(self.ctx.clone(), &self.cfg, self.weights.clone(), opts)
    }
}

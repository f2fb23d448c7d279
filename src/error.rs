//! One error type for the library. Variants carry what a user needs to act on the failure.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum KilnError {
    #[error("no usable GPU adapter found{detail}; install a GPU driver with Vulkan, Metal or DX12 support, or Mesa's software Vulkan driver (Debian/Ubuntu: apt-get install mesa-vulkan-drivers)")]
    NoAdapter { detail: String },

    #[error("no adapter matches --gpu {wanted:?}; `kiln info` lists the adapters ({available})")]
    AdapterNotFound { wanted: String, available: String },

    #[error("adapter {adapter:?} cannot run kiln: {reason}")]
    AdapterUnusable { adapter: String, reason: String },

    #[error("could not open a device on {adapter:?}: {reason}")]
    RequestDevice { adapter: String, reason: String },

    #[error("GPU error in {context}: {message}")]
    Gpu { context: String, message: String },

    #[error("GPU did not finish {what} within {seconds} s (device lost or hung)")]
    GpuTimeout { what: String, seconds: u64 },

    #[error("shader {label} failed to compile: {message}")]
    Shader { label: String, message: String },

    #[error("{what} needs {needed} bytes but the adapter allows at most {limit} bytes per buffer")]
    TooLarge { what: String, needed: u64, limit: u64 },

    #[error("not enough GPU memory for {what}: {:.1} MiB needed, the adapter has {:.1} MiB; {hint}", *needed as f64 / 1048576.0, *available as f64 / 1048576.0)]
    OutOfMemory { what: String, needed: u64, available: u64, hint: String },

    #[error("{count} of kiln doctor's checks failed on {adapter} ({failed}): kiln computes wrongly there; please attach {} to a bug report", report.display())]
    ChecksFailed { count: usize, adapter: String, failed: String, report: PathBuf },

    #[error("download of {what} failed: {message}")]
    Download { what: String, message: String },

    #[error("invalid {what}: {message}")]
    InvalidInput { what: String, message: String },

    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },

    #[error("{0}")]
    Quant(#[from] crate::quant::QuantError),

    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = KilnError> = std::result::Result<T, E>;

impl KilnError {
    pub fn invalid(what: impl Into<String>, message: impl Into<String>) -> Self {
        KilnError::InvalidInput { what: what.into(), message: message.into() }
    }

    /// Writing to a pipe whose reader went away (`kiln … | head`): not an error to report.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, KilnError::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// Exit code convention shared with the CLI: 2 = bad input, 1 = runtime failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            KilnError::InvalidInput { .. }
            | KilnError::File { .. }
            | KilnError::AdapterNotFound { .. }
            | KilnError::Quant(_) => 2,
            _ => 1,
        }
    }
}

//! The model: architecture configuration, weights on the GPU, and sessions that run the
//! forward pass.

pub mod config;
pub mod session;
pub mod sizes;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use session::{BackToBack, HostTimes, Output, Session, SessionOptions, StepTiming};
pub use sizes::{fit_session, SessionSizes};
pub use weights::Weights;

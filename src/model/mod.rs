//! The model: architecture configuration and (next) weights and the forward pass.

pub mod config;

pub use config::{Arch, ModelConfig};

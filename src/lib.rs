//! kiln: a portable GPU inference engine for Llama-family GGUF models, on wgpu.
//!
//! Layers, each calling only the one below: `cli` → engine API → `model` → `kernels` (+
//! `wgsl/`) → `gpu`; with `gguf`, `quant` and `tokenizer` beside them, free of GPU code.

pub mod bench;
pub mod chat;
pub mod cli;
pub mod config;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod gpu;
pub mod hub;
pub mod kernels;
pub mod model;
pub mod perplexity;
pub mod plan;
pub mod profile;
pub mod quant;
pub mod report;
pub mod sample;
pub mod server;
pub mod stop;
pub mod synth;
pub mod tokenizer;

pub use error::{KilnError, Result};

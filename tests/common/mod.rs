//! Shared helpers for GPU tests: the adapters each kernel runs on, seeded data, tolerances.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kiln::config::Disabled;
use kiln::gpu::{ContextOptions, GpuContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Test data: `KILN_TESTDATA`, or `../shared/testdata` beside the repository.
pub fn testdata() -> PathBuf {
    std::env::var_os("KILN_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata"))
}

/// A named device every kernel test runs on.
pub struct TestGpu {
    pub name: &'static str,
    pub ctx: Arc<GpuContext>,
}

fn open(name: &'static str, opts: ContextOptions) -> Option<TestGpu> {
    match GpuContext::new(&opts) {
        Ok(ctx) => {
            eprintln!("[{name}] {}  caps {:?}", ctx.describe(), ctx.caps);
            Some(TestGpu { name, ctx })
        }
        Err(e) => {
            eprintln!("[{name}] not available: {e}");
            None
        }
    }
}

/// The best adapter with every capability kiln uses, the same adapter with the portable
/// fallbacks forced (KILN_DISABLE=all), and wgpu's GL backend where one is present.
/// The first two must exist: a machine without any adapter fails the tests.
pub fn gpus() -> &'static [TestGpu] {
    static GPUS: OnceLock<Vec<TestGpu>> = OnceLock::new();
    GPUS.get_or_init(|| {
        let mut v = Vec::new();
        let full = open("native", ContextOptions::default()).expect("no GPU adapter: install mesa-vulkan-drivers");
        let backend = full.ctx.info.backend;
        v.push(full);
        v.push(
            open(
                "native-fallback",
                ContextOptions { disable: Disabled::ALL, backend: Some(backend), ..Default::default() },
            )
            .expect("fallback context"),
        );
        if std::env::var("KILN_TEST_GL").as_deref() != Ok("0") && backend != wgpu::Backend::Gl {
            if let Some(gl) = open(
                "gl",
                ContextOptions { backend: Some(wgpu::Backend::Gl), disable: Disabled::ALL, ..Default::default() },
            ) {
                v.push(gl);
            }
        }
        v
    })
}

/// A context that plans with a tiny storage-binding limit, to force tensor splitting.
pub fn small_binding_gpu(limit: u64) -> Arc<GpuContext> {
    GpuContext::new(&ContextOptions { max_binding_override: Some(limit), ..Default::default() }).expect("GPU")
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn randn(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            // Box-Muller
            let u1: f32 = rng.random::<f32>().max(1e-7);
            let u2: f32 = rng.random::<f32>();
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos() * scale
        })
        .collect()
}

/// Fails with the first offending index unless max |got - want| <= tol * max(1, max |want|).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let mut worst = (0usize, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if !(d <= worst.1) {
            worst = (i, d);
        }
        if !(d <= tol * scale) {
            panic!("{what}: index {i}: got {g}, want {w} (|Δ| {d} > {tol} x {scale})");
        }
    }
    eprintln!("{what}: max |Δ| {:.3e} at {} (scale {scale:.3})", worst.1, worst.0);
}

//! Shared helpers for GPU tests: the adapters each kernel runs on, seeded data, tolerances.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kiln::config::Disabled;
use kiln::doctor::compare;
use kiln::doctor::data::Rng;
use kiln::gpu::{ContextOptions, GpuContext};

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

/// The native adapter with split decode attention merged by its last workgroups
/// (`Caps::decode_merge`, asked for whatever the environment says), where the adapter can.
pub fn merge_gpu() -> Option<&'static TestGpu> {
    static GPU: OnceLock<Option<TestGpu>> = OnceLock::new();
    GPU.get_or_init(|| open("native-merge", ContextOptions { decode_merge: Some(true), ..Default::default() })).as_ref()
}

/// The same merge with the other choice of its fence after the count than the native
/// adapter's default (`Caps::decode_merge_acquire`): without it on lavapipe (NVIDIA's
/// default), with it on NVIDIA; so that both variants run against the reference.
pub fn merge_other_fence_gpu() -> Option<&'static TestGpu> {
    static GPU: OnceLock<Option<TestGpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let acquire = !gpus()[0].ctx.caps.decode_merge_acquire;
        let opts =
            ContextOptions { decode_merge: Some(true), decode_merge_acquire: Some(acquire), ..Default::default() };
        open(if acquire { "native-merge-acquire" } else { "native-merge-unfenced" }, opts)
    })
    .as_ref()
}

/// A context that plans with a tiny storage-binding limit, to force tensor splitting.
pub fn small_binding_gpu(limit: u64) -> Arc<GpuContext> {
    GpuContext::new(&ContextOptions { max_binding_override: Some(limit), ..Default::default() }).expect("GPU")
}

/// Seeded test data (the doctor's generator: the same values on every machine).
pub fn rng(seed: u64) -> Rng {
    Rng::new(seed)
}

pub fn randn(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    rng.normal(n, scale)
}

/// Fails with the first offending index unless max |got - want| <= tol * max(1, max |want|).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let c = compare::close(got, want, tol);
    assert!(c.passed(), "{what}: {c}");
    eprintln!("{what}: {c}");
}

/// |got - want| <= bound + tol x max(1, max |want|), element by element.
pub fn assert_within(what: &str, got: &[f32], want: &[f32], bound: &[f32], tol: f32) {
    let c = compare::within(got, want, bound, tol);
    assert!(c.passed(), "{what}: {c}");
    eprintln!("{what}: {c}");
}

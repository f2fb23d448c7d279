//! Resource limits: a model larger than the adapter's memory is refused before upload with
//! the sizes, a context too large for memory is reduced with a warning (or refused when -c
//! asked for it), a buffer over the adapter's maximum is refused with a clear message, and
//! `kiln run -v` reports GPU memory by use. `KILN_GPU_MEMORY` stands in for a small GPU.

mod common;

use std::process::Command;

use common::testdata;
use kiln::gpu::{ContextOptions, GpuContext};

fn run(memory: Option<&str>, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(["run", "-m"]).arg(testdata().join("stories260K/stories260K.gguf"));
    c.args(["-p", "Once", "-n", "4", "--temp", "0"]).args(extra);
    if let Some(m) = memory {
        c.env("KILN_GPU_MEMORY", m);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_model_larger_than_memory_is_refused_before_upload() {
    let (code, _, err) = run(Some("512K"), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("not enough GPU memory for the weights") && err.contains("MiB needed, the adapter has 0.5 MiB"),
        "{err}"
    );
}

#[test]
fn a_context_too_large_for_memory_is_reduced_with_a_warning() {
    let (code, out, err) = run(Some("4M"), &["-v"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("kiln: context reduced to"), "{err}");
    assert!(!out.trim().is_empty());
    // ... or refused when the user asked for it.
    let (code, _, err) = run(Some("4M"), &["-c", "2048"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not enough GPU memory for a context of 2048 tokens") && err.contains("use -c"), "{err}");
}

#[test]
fn run_v_reports_gpu_memory() {
    let (code, _, err) = run(None, &["-v", "-c", "256"]);
    assert_eq!(code, Some(0), "{err}");
    let line = err.lines().find(|l| l.contains("GPU memory:")).unwrap_or_else(|| panic!("no memory report: {err}"));
    assert!(line.contains("weights") && line.contains("KV cache") && line.contains("activations"), "{line}");
    assert!(line.contains("(256 tokens)"), "{line}");
}

#[test]
fn a_buffer_over_the_adapter_maximum_is_refused() {
    let ctx = GpuContext::new(&ContextOptions::default()).expect("GPU");
    let err = ctx.storage(ctx.limits.max_buffer_size + 1, "blk.0.ffn_norm.weight").unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_norm.weight needs") && err.contains("allows at most"), "{err}");
}

//! Embeds the git commit in the binary, for benchmark records.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KILN_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves (a commit, a checkout); only paths that exist.
    let dirs: Vec<String> = ["--git-dir", "--git-common-dir"].iter().filter_map(|a| git(&["rev-parse", a])).collect();
    for dir in &dirs {
        for p in ["HEAD", "refs/heads", "packed-refs"] {
            let path = std::path::Path::new(dir).join(p);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    if dirs.is_empty() {
        println!("cargo:rerun-if-changed=build.rs");
    }
}

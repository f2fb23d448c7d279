//! Cooperative-matrix GEMM experiments (issue 12): tile shapes for a GEMM whose f16 operands
//! are read as 16x16 fragments straight from storage buffers, timed with timestamp queries
//! and checked against an f64 CPU reference on sampled outputs.
//! `cargo run --release --example coop_lab` (needs an adapter with cooperative matrices);
//! `coop_lab validate` only checks every variant with naga (any machine).

use kiln::gpu::timer::PassTimer;
use kiln::gpu::{ContextOptions, GpuContext};

#[derive(Clone, Copy, Debug)]
struct Variant {
    /// Subgroups along M and N, fragments (16x16) per subgroup along M and N.
    sgm: u32,
    sgn: u32,
    fm: u32,
    fnn: u32,
}

impl Variant {
    fn bm(&self) -> u32 {
        self.sgm * self.fm * 16
    }
    fn bn(&self) -> u32 {
        self.sgn * self.fnn * 16
    }
    fn wg(&self) -> u32 {
        self.sgm * self.sgn * 32
    }
    fn name(&self) -> String {
        format!("direct {}x{} (sg {}x{}, frags {}x{})", self.bm(), self.bn(), self.sgm, self.sgn, self.fm, self.fnn)
    }
}

/// What both kernels declare: the parameters, W and X as arrays of `elem`, Y, the fragments.
fn header(elem: &str) -> String {
    let mut s = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n");
    s += "struct P { m: u32, n: u32, k: u32, pad: u32 }\n";
    s += "@group(0) @binding(0) var<uniform> p: P;\n";
    s += &format!("@group(0) @binding(1) var<storage, read> w: array<{elem}>;\n");
    s += &format!("@group(0) @binding(2) var<storage, read> xh: array<{elem}>;\n");
    s += "@group(0) @binding(3) var<storage, read_write> y: array<f32>;\n";
    s += "alias TA = coop_mat16x16<f16, A>;\nalias TB = coop_mat16x16<f16, B>;\nalias TC = coop_mat16x16<f32, C>;\n";
    s
}

fn direct_src(v: Variant) -> String {
    let mut s = header("f16");
    s += &format!("@compute @workgroup_size({})\n", v.wg());
    s += "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {\n";
    s += "  let sg = lid / 32u;\n  let ks = p.k;\n  let ns = p.n;\n";
    s += &format!("  let m0 = wid.y * {}u + (sg / {}u) * {}u;\n", v.bm(), v.sgn, v.fm * 16);
    s += &format!("  let n0 = wid.x * {}u + (sg % {}u) * {}u;\n", v.bn(), v.sgn, v.fnn * 16);
    for i in 0..v.fm {
        for j in 0..v.fnn {
            s += &format!("  var c{i}_{j} = TC();\n");
        }
    }
    s += "  for (var k = 0u; k < ks; k += 16u) {\n";
    for i in 0..v.fm {
        s += &format!("    let ia{i} = (m0 + {}u) * ks + k;\n    let a{i} = coopLoadT<TA>(&xh[ia{i}], ks);\n", i * 16);
    }
    for j in 0..v.fnn {
        s += &format!("    let ib{j} = (n0 + {}u) * ks + k;\n    let b{j} = coopLoad<TB>(&w[ib{j}], ks);\n", j * 16);
    }
    for i in 0..v.fm {
        for j in 0..v.fnn {
            s += &format!("    c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});\n");
        }
    }
    s += "  }\n";
    for i in 0..v.fm {
        for j in 0..v.fnn {
            s += &format!(
                "  let iy{i}_{j} = (m0 + {}u) * ns + n0 + {}u;\n  coopStoreT(c{i}_{j}, &y[iy{i}_{j}], ns);\n",
                i * 16,
                j * 16
            );
        }
    }
    s += "}\n";
    s
}

/// Staged: A and B tiles copied through workgroup memory (16-byte global loads, rows padded
/// by 8 halves against bank conflicts), double-buffered with one barrier per K step.
fn staged_src(v: Variant, bk: u32, xf32: bool) -> String {
    let (bm, bn, t) = (v.bm(), v.bn(), v.wg());
    let lds = bk + 8;
    let na = bm * bk / 8 / t;
    let nb = bn * bk / 8 / t;
    assert!(na >= 1 && nb >= 1 && (bm * bk / 8) % t == 0 && (bn * bk / 8) % t == 0);
    let mut s = header("vec4<u32>");
    if xf32 {
        // X as f32 (kiln's activations), rounded to f16 while staged: two 16-byte loads per 8.
        s = s.replace("var<storage, read> xh: array<vec4<u32>>", "var<storage, read> xh: array<vec4<f32>>");
        s += "fn pack8(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> { return vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw)); }\n";
    }
    s += &format!(
        "var<workgroup> sa: array<f16, {}>;\nvar<workgroup> sb: array<f16, {}>;\n",
        2 * bm * lds,
        2 * bn * lds
    );
    s += "fn put8(base: u32, v: vec4<u32>, which: u32) {\n";
    s += "  let h0 = vec2<f16>(unpack2x16float(v.x)); let h1 = vec2<f16>(unpack2x16float(v.y)); let h2 = vec2<f16>(unpack2x16float(v.z)); let h3 = vec2<f16>(unpack2x16float(v.w));\n";
    s += "  if (which == 0u) { sa[base] = h0.x; sa[base+1u] = h0.y; sa[base+2u] = h1.x; sa[base+3u] = h1.y; sa[base+4u] = h2.x; sa[base+5u] = h2.y; sa[base+6u] = h3.x; sa[base+7u] = h3.y; }\n";
    s += "  else { sb[base] = h0.x; sb[base+1u] = h0.y; sb[base+2u] = h1.x; sb[base+3u] = h1.y; sb[base+4u] = h2.x; sb[base+5u] = h2.y; sb[base+6u] = h3.x; sb[base+7u] = h3.y; }\n";
    s += "}\n";
    s += &format!("@compute @workgroup_size({t})\n");
    s += "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {\n";
    s += "  let sg = lid / 32u;\n  let k8 = p.k / 8u;\n  let ns = p.n;\n";
    s += &format!("  let wm0 = wid.y * {bm}u;\n  let wn0 = wid.x * {bn}u;\n");
    s +=
        &format!("  let sm0 = (sg / {}u) * {}u;\n  let sn0 = (sg % {}u) * {}u;\n", v.sgn, v.fm * 16, v.sgn, v.fnn * 16);
    for i in 0..v.fm {
        for j in 0..v.fnn {
            s += &format!("  var c{i}_{j} = TC();\n");
        }
    }
    // per-thread copy slots
    let cpr = bk / 8; // vec4s per tile row
    for a in 0..na {
        s += &format!("  let ar{a} = (lid + {}u) / {cpr}u; let ac{a} = (lid + {}u) % {cpr}u;\n", a * t, a * t);
    }
    for b in 0..nb {
        s += &format!("  let br{b} = (lid + {}u) / {cpr}u; let bc{b} = (lid + {}u) % {cpr}u;\n", b * t, b * t);
    }
    let xload = |a: u32, off: &str| -> String {
        if xf32 {
            format!(
                "pack8(xh[((wm0 + ar{a}) * k8 + {off}ac{a}) * 2u], xh[((wm0 + ar{a}) * k8 + {off}ac{a}) * 2u + 1u])"
            )
        } else {
            format!("xh[(wm0 + ar{a}) * k8 + {off}ac{a}]")
        }
    };
    for a in 0..na {
        s += &format!("  var ga{a} = {};\n", xload(a, ""));
    }
    for b in 0..nb {
        s += &format!("  var gb{b} = w[(wn0 + br{b}) * k8 + bc{b}];\n");
    }
    for a in 0..na {
        s += &format!("  put8(ar{a} * {lds}u + ac{a} * 8u, ga{a}, 0u);\n");
    }
    for b in 0..nb {
        s += &format!("  put8(br{b} * {lds}u + bc{b} * 8u, gb{b}, 1u);\n");
    }
    s += "  workgroupBarrier();\n";
    s += &format!("  let kt_n = p.k / {bk}u;\n");
    s += "  for (var kt = 0u; kt < kt_n; kt++) {\n";
    s += "    let cur = kt % 2u;\n    let more = kt + 1u < kt_n;\n";
    s += &format!("    let kn8 = (kt + 1u) * {}u;\n", bk / 8);
    s += "    if (more) {\n";
    for a in 0..na {
        s += &format!("      ga{a} = {};\n", xload(a, "kn8 + "));
    }
    for b in 0..nb {
        s += &format!("      gb{b} = w[(wn0 + br{b}) * k8 + kn8 + bc{b}];\n");
    }
    s += "    }\n";
    s += &format!("    let abase = cur * {}u;\n    let bbase = cur * {}u;\n", bm * lds, bn * lds);
    for kk in 0..bk / 16 {
        for i in 0..v.fm {
            s += &format!(
                "    let ia{kk}_{i} = abase + (sm0 + {}u) * {lds}u + {}u;\n    let a{kk}_{i} = coopLoadT<TA>(&sa[ia{kk}_{i}], {lds}u);\n",
                i * 16,
                kk * 16
            );
        }
        for j in 0..v.fnn {
            s += &format!(
                "    let ib{kk}_{j} = bbase + (sn0 + {}u) * {lds}u + {}u;\n    let b{kk}_{j} = coopLoad<TB>(&sb[ib{kk}_{j}], {lds}u);\n",
                j * 16,
                kk * 16
            );
        }
        for i in 0..v.fm {
            for j in 0..v.fnn {
                s += &format!("    c{i}_{j} = coopMultiplyAdd(a{kk}_{i}, b{kk}_{j}, c{i}_{j});\n");
            }
        }
    }
    s += "    if (more) {\n";
    s += &format!("      let nxa = (1u - cur) * {}u;\n      let nxb = (1u - cur) * {}u;\n", bm * lds, bn * lds);
    for a in 0..na {
        s += &format!("      put8(nxa + ar{a} * {lds}u + ac{a} * 8u, ga{a}, 0u);\n");
    }
    for b in 0..nb {
        s += &format!("      put8(nxb + br{b} * {lds}u + bc{b} * 8u, gb{b}, 1u);\n");
    }
    s += "    }\n    workgroupBarrier();\n  }\n";
    for i in 0..v.fm {
        for j in 0..v.fnn {
            s += &format!(
                "  let iy{i}_{j} = (wm0 + sm0 + {}u) * ns + wn0 + sn0 + {}u;\n  coopStoreT(c{i}_{j}, &y[iy{i}_{j}], ns);\n",
                i * 16,
                j * 16
            );
        }
    }
    s += "}\n";
    s
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Direct(Variant),
    Staged(Variant, u32),
    /// Staged with X in f32, rounded to f16 on the way (kiln's activations).
    StagedF32X(Variant, u32),
}

impl Kind {
    fn src(&self) -> String {
        match *self {
            Kind::Direct(v) => direct_src(v),
            Kind::Staged(v, bk) => staged_src(v, bk, false),
            Kind::StagedF32X(v, bk) => staged_src(v, bk, true),
        }
    }
    fn v(&self) -> Variant {
        match *self {
            Kind::Direct(v) | Kind::Staged(v, _) | Kind::StagedF32X(v, _) => v,
        }
    }
    fn name(&self) -> String {
        match *self {
            Kind::Direct(v) => v.name(),
            Kind::Staged(v, bk) => format!("staged bk{bk} {}", v.name().trim_start_matches("direct ")),
            Kind::StagedF32X(v, bk) => format!("staged f32 x bk{bk} {}", v.name().trim_start_matches("direct ")),
        }
    }
}

fn kinds() -> Vec<Kind> {
    let v = |sgm, sgn, fm, fnn| Variant { sgm, sgn, fm, fnn };
    vec![
        Kind::Direct(v(2, 2, 4, 4)),
        Kind::Direct(v(1, 1, 4, 4)),
        Kind::Staged(v(2, 2, 4, 4), 32),
        Kind::Staged(v(2, 2, 2, 4), 32),
        Kind::Staged(v(2, 2, 4, 2), 32),
        Kind::Staged(v(2, 4, 4, 2), 32),
        Kind::Staged(v(4, 2, 2, 4), 32),
        Kind::Staged(v(2, 4, 2, 2), 32),
        Kind::Staged(v(1, 4, 4, 2), 32),
        Kind::Staged(v(2, 2, 2, 2), 32),
        Kind::Staged(v(2, 2, 2, 2), 64),
        Kind::Staged(v(1, 2, 4, 4), 32),
        Kind::Staged(v(2, 1, 4, 4), 32),
        Kind::Staged(v(1, 2, 4, 2), 64),
        Kind::StagedF32X(v(2, 4, 4, 2), 32),
        Kind::StagedF32X(v(2, 2, 2, 2), 32),
    ]
}

fn validate(src: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    let mut val = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let info = val.validate(&module).map_err(|e| format!("{e:?}"))?;
    naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
        .map_err(|e| format!("{e:?}"))?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("validate") {
        for v in kinds() {
            match validate(&v.src()) {
                Ok(()) => println!("ok   {}", v.name()),
                Err(e) => {
                    println!("FAIL {}: {e}", v.name());
                    println!("{}", v.src());
                    std::process::exit(1);
                }
            }
        }
        return;
    }
    let ctx = GpuContext::new(&ContextOptions::from_env().expect("env")).expect("GPU");
    println!("adapter: {}  caps {:?}", ctx.describe(), ctx.caps);
    if !ctx.caps.coopmat {
        println!("no cooperative matrices on this adapter");
        return;
    }
    let mut timer = PassTimer::new(&ctx, 1).expect("timestamps");
    // (m, k, n): TinyLlama's prefill shapes, Llama-7B's FFN, and the 4096^3 target.
    let shapes: Vec<(u32, u32, u32)> = match std::env::var("COOP_SHAPES") {
        Ok(s) => s
            .split(',')
            .map(|t| {
                let v: Vec<u32> = t.split('x').map(|x| x.parse().unwrap()).collect();
                (v[0], v[1], v[2])
            })
            .collect(),
        Err(_) => vec![(512, 2048, 2048), (512, 2048, 5632), (512, 5632, 2048), (512, 4096, 11008), (4096, 4096, 4096)],
    };
    let only: Option<Vec<usize>> =
        std::env::var("COOP_ONLY").ok().map(|s| s.split(',').map(|x| x.parse().unwrap()).collect());
    for (m, k, n) in shapes {
        let mut rng = 1u64;
        let mut rnd = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((rng >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let wv: Vec<half::f16> = (0..n as usize * k as usize).map(|_| half::f16::from_f32(rnd())).collect();
        let xv: Vec<half::f16> = (0..m as usize * k as usize).map(|_| half::f16::from_f32(rnd())).collect();
        let wb = ctx.upload(bytemuck::cast_slice(&wv), "w").unwrap();
        let xb = ctx.upload(bytemuck::cast_slice(&xv), "x").unwrap();
        let xv32: Vec<f32> = xv.iter().map(|h| h.to_f32()).collect();
        let xb32 = ctx.upload(bytemuck::cast_slice(&xv32), "x32").unwrap();
        let yb = ctx.storage(m as u64 * n as u64 * 4, "y").unwrap();
        let pb = ctx.uniform(&[m, n, k, 0u32], "p");
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        // Sampled outputs for the check.
        let samples: Vec<(usize, usize)> =
            (0..64).map(|i| ((i * 7919) % m as usize, (i * 104729 + i * i * 31) % n as usize)).collect();
        let refs: Vec<f64> = samples
            .iter()
            .map(|&(mi, ni)| {
                (0..k as usize).map(|kk| xv[mi * k as usize + kk].to_f64() * wv[ni * k as usize + kk].to_f64()).sum()
            })
            .collect();
        for (vi, kind) in kinds().into_iter().enumerate() {
            let v = kind.v();
            if let Some(o) = &only {
                if !o.contains(&vi) {
                    continue;
                }
            }
            if m % v.bm() != 0 || n % v.bn() != 0 {
                continue;
            }
            if let Kind::Staged(_, bk) | Kind::StagedF32X(_, bk) = kind {
                if k % bk != 0 {
                    continue;
                }
            }
            let src = kind.src();
            let module = unsafe {
                ctx.device.create_shader_module_trusted(
                    wgpu::ShaderModuleDescriptor { label: Some("coop"), source: wgpu::ShaderSource::Wgsl(src.into()) },
                    wgpu::ShaderRuntimeChecks::unchecked(),
                )
            };
            let pipe = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("coop"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &[],
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
            let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: pb.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: wb.as_entire_binding() },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: if matches!(kind, Kind::StagedF32X(..)) { &xb32 } else { &xb }.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry { binding: 3, resource: yb.as_entire_binding() },
                ],
            });
            let run = |iters: u32, timer: &mut PassTimer| -> f64 {
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: timer.pass("gemm"),
                    });
                    pass.set_pipeline(&pipe);
                    pass.set_bind_group(0, &bg, &[]);
                    for _ in 0..iters {
                        pass.dispatch_workgroups(n / v.bn(), m / v.bm(), 1);
                    }
                }
                timer.resolve(&mut enc);
                ctx.queue.submit([enc.finish()]);
                timer.read(&ctx).unwrap()[0].1 * 1e-9 / iters as f64
            };
            run(2, &mut timer);
            let iters = ((0.05 / (flops / 100e12)) as u32).clamp(3, 200);
            let t = (0..3).map(|_| run(iters, &mut timer)).fold(f64::MAX, f64::min);
            let y = ctx.read_f32(&yb, m as usize * n as usize).unwrap();
            let mut worst = 0.0f64;
            for (s, &(mi, ni)) in samples.iter().enumerate() {
                let got = y[mi * n as usize + ni] as f64;
                worst = worst.max((got - refs[s]).abs() / (1.0 + refs[s].abs()));
            }
            println!(
                "{m}x{k}x{n} #{vi:2} {:40} {:9.1} us {:7.1} TFLOP/s  max rel err {:.2e}{}",
                kind.name(),
                t * 1e6,
                flops / t / 1e12,
                worst,
                if worst > 1e-2 { "  WRONG" } else { "" }
            );
        }
    }
}

//! What a dependent dispatch costs against a grid-wide hand-off inside one dispatch (issue 11:
//! a decode step is ~116 dependent dispatches, each a GEMV or attention of a few µs). Phase A
//! has `n_a` workgroups each sum a chunk of `src` and publish one value; phase B has `n_b`
//! workgroups each read all of A's values and sum a chunk of their own. Timed three ways with
//! timestamp queries, `reps` times back to back in one pass:
//! - "A alone", "B alone": each phase as its own dispatches (B reading stale values);
//! - "A then B": two dispatches, the barrier between them as kiln's steps have it;
//! - "fused": one dispatch of n_a + n_b workgroups. Each workgroup takes a ticket (an atomic
//!   counter) on start; tickets below n_a do A's work and count themselves done, the rest wait
//!   (spinning on the count, bounded) for all of A and then do B's. A waiter only ever waits for
//!   workgroups that took their tickets, so started, before it: the hand-off cannot deadlock
//!   where started workgroups keep running, which Vulkan does not promise but GPUs do.
//!
//! The last B workgroup to finish resets the counters for the next dispatch.
//! `cargo run --release --example grid_sync_lab` (any adapter; `validate` checks the WGSL with
//! naga only).

use kiln::gpu::timer::PassTimer;
use kiln::gpu::{ContextOptions, GpuContext};

const WG: u32 = 128;
/// Spins a waiting workgroup makes before it gives up (and flags it in `out`).
const SPIN_MAX: u32 = 1 << 22;

fn src() -> String {
    format!(
        r#"
const WG: u32 = {WG}u;
const SPIN_MAX: u32 = {SPIN_MAX}u;
struct P {{ n_a: u32, n_b: u32, chunk: u32, pad: u32 }}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> data: array<vec4<f32>>;
// A's values, read by other workgroups of the same dispatch: atomics, so always coherent.
@group(0) @binding(2) var<storage, read_write> mid: array<atomic<u32>>;
// [0] tickets taken, [1] A workgroups done, [2] B workgroups done, [3] waits given up.
@group(0) @binding(3) var<storage, read_write> ctr: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, WG>;
var<workgroup> shared_u: u32;

fn total(v: f32, lid: u32) -> f32 {{
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {{
        if (lid < s) {{ red[lid] += red[lid + s]; }}
        workgroupBarrier();
    }}
    let t = red[0];
    workgroupBarrier();
    return t;
}}

fn stream(first: u32, lid: u32) -> f32 {{
    var a = vec4<f32>(0.0);
    for (var i = lid; i < p.chunk; i += WG) {{ a += data[first + i]; }}
    return a.x + a.y + a.z + a.w;
}}

fn phase_a(t: u32, lid: u32) {{
    let s = total(stream(t * p.chunk, lid), lid);
    if (lid == 0u) {{ atomicStore(&mid[t], bitcast<u32>(s)); }}
}}

fn phase_b(t: u32, lid: u32) {{
    var d = 0.0;
    for (var j = lid; j < p.n_a; j += WG) {{ d += bitcast<f32>(atomicLoad(&mid[j])); }}
    let s = total(d + stream((p.n_a + t) * p.chunk, lid), lid);
    if (lid == 0u) {{ out[t] = s; }}
}}

@compute @workgroup_size(WG)
fn a_alone(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    phase_a(wid.x, lid);
}}

@compute @workgroup_size(WG)
fn b_alone(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    phase_b(wid.x, lid);
}}

@compute @workgroup_size(WG)
fn fused(@builtin(local_invocation_index) lid: u32) {{
    if (lid == 0u) {{ shared_u = atomicAdd(&ctr[0], 1u); }}
    let t = workgroupUniformLoad(&shared_u);
    if (t < p.n_a) {{
        phase_a(t, lid);
        // A's value out before it counts itself done.
        storageBarrier();
        if (lid == 0u) {{ atomicAdd(&ctr[1], 1u); }}
        return;
    }}
    if (lid == 0u) {{
        var k = 0u;
        loop {{
            if (atomicLoad(&ctr[1]) >= p.n_a || k >= SPIN_MAX) {{ break; }}
            k++;
        }}
        if (k >= SPIN_MAX) {{ atomicAdd(&ctr[3], 1u); }}
    }}
    workgroupBarrier();
    storageBarrier();
    phase_b(t - p.n_a, lid);
    storageBarrier();
    if (lid == 0u) {{
        if (atomicAdd(&ctr[2], 1u) + 1u == p.n_b) {{
            atomicStore(&ctr[0], 0u);
            atomicStore(&ctr[1], 0u);
            atomicStore(&ctr[2], 0u);
        }}
    }}
}}
"#
    )
}

fn main() {
    let text = src();
    if std::env::args().nth(1).as_deref() == Some("validate") {
        let module = naga::front::wgsl::parse_str(&text).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&text)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .expect("valid");
        println!("ok");
        return;
    }
    let ctx = GpuContext::new(&ContextOptions::from_env().expect("env")).expect("GPU");
    println!("adapter: {}", ctx.describe());
    let mut timer = PassTimer::new(&ctx, 1).expect("timestamps");
    let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("grid sync lab"),
        source: wgpu::ShaderSource::Wgsl(text.into()),
    });
    // One layout for the three entry points (each alone would leave out what it does not use).
    let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let bgl = ctx.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("grid sync lab"),
        entries: &[
            wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            },
            storage(1, true),
            storage(2, false),
            storage(3, false),
            storage(4, false),
        ],
    });
    let layout = ctx.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("grid sync lab"),
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    let pipe = |entry: &str| {
        ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        })
    };
    let (pa, pb, pf) = (pipe("a_alone"), pipe("b_alone"), pipe("fused"));
    // (workgroups of A, of B, vec4s a workgroup sums): many small workgroups as a Q/K/V GEMV,
    // few large ones as TinyLlama's gate/up and down projections.
    let configs: [(u32, u32, u32); 3] = [(1024, 1024, 128), (176, 64, 4608), (32, 1024, 64)];
    let reps = 200u32;
    for (n_a, n_b, chunk) in configs {
        let vecs = ((n_a + n_b) * chunk) as usize;
        let data: Vec<f32> = (0..vecs * 4).map(|i| (i % 7) as f32 * 0.25).collect();
        let db = ctx.upload(bytemuck::cast_slice(&data), "data").unwrap();
        let mid = ctx.storage(n_a as u64 * 4, "mid").unwrap();
        let ctr = ctx.upload(bytemuck::cast_slice(&[0u32; 4]), "counters").unwrap();
        let out = ctx.storage(n_b as u64 * 4, "out").unwrap();
        let pbuf = ctx.uniform(&[n_a, n_b, chunk, 0u32], "p");
        // One bind group serves the three entry points (they share the layout).
        let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &bgl,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: pbuf.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: db.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: mid.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: ctr.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 4, resource: out.as_entire_binding() },
            ],
        });
        let mut time = |steps: &[(&wgpu::ComputePipeline, u32)]| -> f64 {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: timer.pass("lab"),
                    });
                    for _ in 0..reps {
                        for (pl, n) in steps {
                            pass.set_pipeline(pl);
                            pass.set_bind_group(0, &bg, &[]);
                            pass.dispatch_workgroups(*n, 1, 1);
                        }
                    }
                }
                timer.resolve(&mut enc);
                ctx.queue.submit([enc.finish()]);
                best = best.min(timer.read(&ctx).unwrap()[0].1 * 1e-3 / reps as f64);
            }
            best
        };
        let a = time(&[(&pa, n_a)]);
        let b = time(&[(&pb, n_b)]);
        let ab = time(&[(&pa, n_a), (&pb, n_b)]);
        let f = time(&[(&pf, n_a + n_b)]);
        let counters: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&ctr, 0, 16).unwrap());
        // The fused result against A then B's (the same sums).
        let got = ctx.read_f32(&out, n_b as usize).unwrap();
        let _ = time(&[(&pa, n_a), (&pb, n_b)]);
        let want = ctx.read_f32(&out, n_b as usize).unwrap();
        let same = got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0));
        println!(
            "A {n_a} x {} KiB, B {n_b} x {} KiB: A alone {a:.2} µs, B alone {b:.2}, A then B {ab:.2}, fused {f:.2} \
             (saves {:.2} µs a hand-off); waits given up {}, results {}",
            chunk * 16 / 1024,
            chunk * 16 / 1024,
            ab - f,
            counters[3],
            if same { "equal" } else { "DIFFER" }
        );
    }
}

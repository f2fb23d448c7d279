//! Kernel benchmarks on GPU time (timestamp queries around the pass, not wall time).
//! GEMV on a weight matrix larger than any GPU cache (65536 x 8192) reports GB/s of weights
//! read; GEMM 512 x 2048 -> 5632 (TinyLlama's FFN shape) reports GFLOP/s as "elem/s".
//! GEMMs at 512x2048x5632, 512x4096x11008 and 4096^3 per format, and prefill attention at 512
//! and 4096 tokens, report GFLOP/s as "elem/s"; the adapter's probed peaks are printed first.
//! `KILN_BENCH_SMALL=1` shrinks the shapes for CPU adapters.

use std::cell::OnceCell;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln::gpu::timer::PassTimer;
use kiln::gpu::{ContextOptions, Dispatch, GpuContext, WeightTensor};
use kiln::kernels::matmul::{self, Matmul};
use kiln::plan::{plan_matmul, GemmTile, GemvShape, MatmulKernel};
use kiln::quant::{random_blocks, WeightFormat};

fn small() -> bool {
    std::env::var("KILN_BENCH_SMALL").as_deref() == Ok("1")
}

/// A weight tensor of random valid blocks: one generated slab, repeated (GPU caches cannot
/// tell, the tensor is far larger than any of them).
fn weights(ctx: &GpuContext, format: WeightFormat, n: usize, k: usize) -> WeightTensor {
    let slab_rows = 64.min(n);
    let slab = random_blocks(format, slab_rows * k, 42).expect("random blocks");
    let mut bytes = Vec::with_capacity(format.tensor_bytes(n, k).unwrap());
    while bytes.len() < format.tensor_bytes(n, k).unwrap() {
        bytes.extend_from_slice(&slab);
    }
    bytes.truncate(format.tensor_bytes(n, k).unwrap());
    WeightTensor::upload(ctx, "bench", format, n, k, &bytes).expect("upload")
}

/// GPU seconds per run of `ds`, averaged over `iters` runs recorded into one timed pass.
fn gpu_time(ctx: &GpuContext, timer: &mut PassTimer, ds: &[Dispatch], iters: u64) -> Duration {
    let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("bench") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("bench"),
            timestamp_writes: timer.pass("bench"),
        });
        for _ in 0..iters {
            for d in ds {
                d.record(&mut pass);
            }
        }
    }
    timer.resolve(&mut enc);
    ctx.queue.submit([enc.finish()]);
    let t = timer.read(ctx).expect("timestamps");
    Duration::from_secs_f64(t[0].1 * 1e-9)
}

/// The time of `iters` calls, from that of ceil(iters / copies) rounds over `copies` copies.
fn per_call(t: Duration, iters: u64, copies: usize) -> Duration {
    let calls = iters.div_ceil(copies as u64) * copies as u64;
    t.mul_f64(iters as f64 / calls as f64)
}

fn benches(c: &mut Criterion) {
    let ctx = GpuContext::new(&ContextOptions::from_env().expect("env")).expect("GPU");
    eprintln!("bench adapter: {}  caps {:?}", ctx.describe(), ctx.caps);
    let mut timer = PassTimer::new(&ctx, 1).expect("timestamps");
    // The adapter's measured peaks, to read the figures below against.
    match kiln::kernels::probe::run(&ctx) {
        Ok(p) => eprintln!(
            "bench peaks: read {:.1} GB/s, f32 FMA {:.1} GFLOP/s, f16 matrix multiply-add {:.1} GFLOP/s, dependent dispatch {:.2} µs",
            p.peak.read_gbs, p.peak.gflops, p.peak.mma_gflops, p.peak.dispatch_us
        ),
        Err(e) => eprintln!("bench peaks: probe failed: {e}"),
    }

    // KILN_BENCH_BATCHED=1: the matmuls of a batched decode step (one token of each of m
    // sequences, `kiln serve`) at TinyLlama's shapes, the RMSNorm fused where the model fuses
    // it: the float GEMV, the int8 GEMV and the split-K cooperative GEMM at m = 1-16 columns.
    if std::env::var("KILN_BENCH_BATCHED").as_deref() == Ok("1") {
        let mut g = c.benchmark_group("batched_decode");
        g.sample_size(10).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_millis(600));
        let shapes = [
            (WeightFormat::Q4K, 2560, 2048, true),
            (WeightFormat::Q4K, 2048, 2048, false),
            (WeightFormat::Q4K, 11264, 2048, true),
            (WeightFormat::Q6K, 2048, 5632, false),
            (WeightFormat::Q6K, 32000, 2048, true),
        ];
        for (format, n, k, norm) in shapes {
            let w = weights(&ctx, format, n, k);
            let x = ctx.upload_f32(&vec![0.01f32; 16 * k], "x").unwrap();
            let nw = ctx.upload_f32(&vec![1.0f32; k], "norm").unwrap();
            let y = ctx.storage((16 * n * 4) as u64, "y").unwrap();
            g.throughput(Throughput::Bytes(format.tensor_bytes(n, k).unwrap() as u64));
            for m in [1u32, 2, 4, 8, 16] {
                if std::env::var("KILN_BENCH_BATCHED_M")
                    .map(|v| !v.split(',').any(|x| x == m.to_string()))
                    .unwrap_or(false)
                {
                    continue;
                }
                let mut mm = Matmul::dense(&w, &x, &y, m);
                if norm {
                    mm.norm = Some((&nw, 1e-5));
                }
                let planned = plan_matmul(m, n as u32, k as u32, format, &ctx.caps);
                let mut plans: Vec<(String, Vec<kiln::gpu::Dispatch>)> = Vec::new();
                for (wg, rows) in [(128, 2), (128, 4), (64, 4), (256, 2)] {
                    let plan = MatmulKernel::Gemv { ncols: m.min(8), shape: GemvShape::new(wg, rows), q8: false };
                    plans.push((format!("{plan}"), matmul::prepare_with(&ctx, &mm, plan, "b").unwrap()));
                }
                if ctx.caps.int8_dot {
                    let widths: &[u32] = &[4];
                    for &ncols in widths {
                        for (wg, rows) in [(128, 2), (64, 4)] {
                            let plan =
                                MatmulKernel::Gemv { ncols: m.min(ncols), shape: GemvShape::new(wg, rows), q8: true };
                            plans.push((format!("{plan}"), matmul::prepare_with(&ctx, &mm, plan, "b").unwrap()));
                        }
                    }
                    // The grouped shapes (each group of invocations its own rows): the planner's
                    // and its neighbours, over 8 columns a workgroup (fewer below 8).
                    let shapes: &[(u32, u32, u32)] = if m > 4 {
                        &[(128, 2, 4), (128, 2, 2), (128, 2, 1), (256, 2, 4), (64, 2, 2)]
                    } else {
                        &[(128, 2, 4), (64, 2, 2), (128, 2, 2), (256, 2, 4), (128, 4, 4), (64, 4, 2)]
                    };
                    for &(wg, rows, groups) in shapes {
                        let shape = GemvShape::grouped(wg, rows, groups);
                        let ncols = m.min(kiln::plan::GEMV_Q8_WIDE_COLS);
                        let plan = MatmulKernel::Gemv { ncols, shape, q8: true };
                        plans.push((format!("{plan}"), matmul::prepare_with(&ctx, &mm, plan, "b").unwrap()));
                    }
                }
                // The cooperative GEMM (without the norm, which it does not fuse: "-norm") at
                // the planner's tile and K ranges, and the small tiles at 1-8 ranges.
                if ctx.caps.coopmat && m >= 2 {
                    let mut plain = Matmul::dense(&w, &x, &y, m);
                    plain.norm = None;
                    let tag = if norm { "-norm" } else { "" };
                    let plan = kiln::plan::plan_gemm(m, n as u32, k as u32, format, &ctx.caps);
                    if let MatmulKernel::Gemm { tile } = plan {
                        let splits = kiln::plan::gemm_splits(m, n as u32, k as u32, tile, &ctx.caps);
                        let ds = matmul::prepare_split(&ctx, &plain, plan, splits, "b", false).unwrap();
                        plans.push((format!("{plan}/split{splits}{tag} (planned gemm)"), ds));
                    }
                    for tile in [GemmTile::Coop16, GemmTile::Coop64] {
                        let plan = MatmulKernel::Gemm { tile };
                        for splits in [1u32, 2, 4, 8] {
                            let ds = matmul::prepare_split(&ctx, &plain, plan, splits, "b", false).unwrap();
                            plans.push((format!("{plan}/split{splits}{tag}"), ds));
                        }
                    }
                }
                for (name, ds) in &plans {
                    let mark = if *name == format!("{planned}") { " (planned)" } else { "" };
                    g.bench_function(
                        format!("{}/{n}x{k}{}/m{m}/{name}{mark}", format.name(), if norm { "+norm" } else { "" }),
                        |b| b.iter_custom(|iters| gpu_time(&ctx, &mut timer, ds, iters)),
                    );
                }
            }
        }
        g.finish();
        return;
    }

    // KILN_BENCH_DECODE=1: the per-layer shapes of TinyLlama's decode (GEMV) and prefill
    // (GEMM) steps, every launch shape: what the planner should pick for small matrices.
    if std::env::var("KILN_BENCH_DECODE").as_deref() == Ok("1") {
        let mut g = c.benchmark_group("decode_shapes");
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
        // KILN_BENCH_DECODE_SHAPES=NxK,...: these shapes instead, each with the planner's float
        // GEMV and the int8-activation GEMV only (where the planner should switch between them).
        let custom: Option<Vec<(usize, usize)>> = std::env::var("KILN_BENCH_DECODE_SHAPES").ok().map(|v| {
            v.split(',')
                .filter_map(|s| s.split_once('x'))
                .map(|(n, k)| (n.trim().parse().unwrap(), k.trim().parse().unwrap()))
                .collect()
        });
        let shapes =
            custom.clone().unwrap_or(vec![(2048, 2048), (256, 2048), (5632, 2048), (2048, 5632), (32000, 2048)]);
        // KILN_BENCH_DECODE_FORMATS=F16,Q4_K,...: these formats with the custom shapes.
        let listed: Option<Vec<WeightFormat>> = std::env::var("KILN_BENCH_DECODE_FORMATS")
            .ok()
            .map(|v| WeightFormat::ALL.into_iter().filter(|f| v.split(',').any(|n| n.trim() == f.name())).collect());
        let formats = if let Some(listed) = listed {
            listed
        } else if custom.is_some() {
            vec![WeightFormat::Q4K, WeightFormat::Q6K]
        } else {
            vec![WeightFormat::Q4K, WeightFormat::Q6K, WeightFormat::Q8_0, WeightFormat::F16]
        };
        for format in formats {
            for &(n, k) in &shapes {
                // With the custom shapes, copies of the matrix enough to fill 192 MiB, read in
                // turn, so that each GEMV reads its weights from memory as a decode step does,
                // not from the last call's cache (an H200's L2 holds 50 MB: a TinyLlama matrix
                // read again and again ran up to twice as fast as in the model).
                let bytes = format.tensor_bytes(n, k).unwrap();
                let copies = if custom.is_some() { (192usize << 20).div_ceil(bytes).clamp(1, 32) } else { 1 };
                let ws: Vec<WeightTensor> = (0..copies).map(|_| weights(&ctx, format, n, k)).collect();
                let x = ctx.upload_f32(&vec![0.01f32; 512 * k], "x").unwrap();
                let y = ctx.storage((512 * n * 4) as u64, "y").unwrap();
                g.throughput(Throughput::Bytes(format.tensor_bytes(n, k).unwrap() as u64));
                let mut plans: Vec<(u32, MatmulKernel)> = Vec::new();
                for q8 in [false, true] {
                    if q8 && !format.is_quantized() {
                        continue;
                    }
                    plans.extend(
                        [(32, 4), (64, 4), (128, 4), (256, 2), (128, 2)].map(|(wg, rows)| {
                            (1, MatmulKernel::Gemv { ncols: 1, shape: GemvShape::new(wg, rows), q8 })
                        }),
                    );
                }
                if custom.is_some() {
                    let ncaps = kiln::gpu::Caps { int8_dot: false, ..ctx.caps };
                    plans = vec![(1, plan_matmul(1, n as u32, k as u32, format, &ncaps))];
                    // The float GEMV's shapes over one column, grouped ones included.
                    // KILN_BENCH_GEMV_FLOAT=<wg>x<rows>x<groups>,...: these shapes instead.
                    let float_shapes: Vec<GemvShape> = match std::env::var("KILN_BENCH_GEMV_FLOAT") {
                        Ok(v) => v.split(',').filter_map(kiln::config::parse_gemv_shape).collect(),
                        Err(_) => [(128, 2, 1), (256, 2, 1), (64, 4, 1), (128, 4, 1)]
                            .map(|(wg, rows, groups)| GemvShape::grouped(wg, rows, groups))
                            .to_vec(),
                    };
                    for shape in float_shapes {
                        let kernel = MatmulKernel::Gemv { ncols: 1, shape, q8: false };
                        if !plans.iter().any(|(_, p)| *p == kernel) {
                            plans.push((1, kernel));
                        }
                    }
                    if format.is_quantized() {
                        for (wg, rows) in [(32, 4), (64, 4), (128, 2), (256, 2), (128, 4), (256, 4)] {
                            let shape = GemvShape::new(wg, rows);
                            plans.push((1, MatmulKernel::Gemv { ncols: 1, shape, q8: true }));
                        }
                        // The grouped shapes (each group of invocations its own rows).
                        for (wg, rows, groups) in
                            [(128, 2, 4), (128, 4, 4), (256, 4, 4), (64, 2, 2), (128, 2, 2), (256, 2, 8), (256, 2, 4)]
                        {
                            let shape = GemvShape::grouped(wg, rows, groups);
                            plans.push((1, MatmulKernel::Gemv { ncols: 1, shape, q8: true }));
                        }
                    }
                } else if n != 32000 {
                    plans.extend([GemmTile::T64, GemmTile::T128x64].map(|tile| (512, MatmulKernel::Gemm { tile })));
                    if ctx.caps.coopmat && format != WeightFormat::F32 {
                        plans.extend(GemmTile::COOP.map(|tile| (512, MatmulKernel::Gemm { tile })));
                    }
                }
                // KILN_BENCH_DECODE_NORM=1: each GEMV with the RMSNorm fused in front, as the
                // decode step runs Q/K/V, gate/up and the LM head.
                let norm_w = ctx.upload_f32(&vec![1.0f32; k], "norm").unwrap();
                let fused = std::env::var("KILN_BENCH_DECODE_NORM").as_deref() == Ok("1");
                for (m, plan) in plans {
                    let per_copy: Vec<Vec<Dispatch>> = ws
                        .iter()
                        .map(|w| {
                            let mm = Matmul { norm: fused.then_some((&norm_w, 1e-5)), ..Matmul::dense(w, &x, &y, m) };
                            matmul::prepare_with(&ctx, &mm, plan, "decode").unwrap()
                        })
                        .collect();
                    let ds: Vec<Dispatch> = per_copy.iter().flatten().cloned().collect();
                    let tag = if fused { "+norm" } else { "" };
                    g.bench_function(format!("{}/{n}x{k}/m{m}/{plan}{tag}", format.name()), |b| {
                        b.iter_custom(|iters| {
                            per_call(gpu_time(&ctx, &mut timer, &ds, iters.div_ceil(copies as u64)), iters, copies)
                        })
                    });
                    // The int8 GEMV without its quantize dispatch: what it would cost where its
                    // input arrives quantized (or each workgroup quantizes it itself).
                    if custom.is_some() && per_copy[0].len() > 1 {
                        let alone: Vec<Dispatch> = per_copy.iter().map(|d| d[d.len() - 1].clone()).collect();
                        g.bench_function(format!("{}/{n}x{k}/m{m}/{plan}{tag}/alone", format.name()), |b| {
                            b.iter_custom(|iters| {
                                per_call(
                                    gpu_time(&ctx, &mut timer, &alone, iters.div_ceil(copies as u64)),
                                    iters,
                                    copies,
                                )
                            })
                        });
                    }
                }
            }
        }
        g.finish();
        return;
    }

    let (n, k) = if small() { (4096, 2048) } else { (65536, 8192) };
    let mut g = c.benchmark_group(format!("gemv_{n}x{k}"));
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for format in WeightFormat::ALL {
        let w = weights(&ctx, format, n, k);
        let x = ctx.upload_f32(&vec![0.01f32; k], "x").unwrap();
        let y = ctx.storage((n * 4) as u64, "y").unwrap();
        let mm = Matmul::dense(&w, &x, &y, 1);
        let planned = plan_matmul(1, n as u32, k as u32, format, &ctx.caps);
        let mut plans = vec![planned];
        // Quantized formats: the other activation path too (float and int8 dot products).
        if let MatmulKernel::Gemv { ncols, shape, q8 } = planned {
            if format.is_quantized() {
                plans.push(MatmulKernel::Gemv { ncols, shape, q8: !q8 });
            }
        }
        // KILN_BENCH_SWEEP=1: every GEMV launch shape, to tune the planner on this adapter.
        if std::env::var("KILN_BENCH_SWEEP").as_deref() == Ok("1") {
            plans = [false, true]
                .into_iter()
                .filter(|&q8| !q8 || format.is_quantized())
                .flat_map(|q8| {
                    [(32, 4), (64, 4), (128, 4), (128, 2), (256, 2), (64, 2), (32, 8), (64, 8), (256, 4)]
                        .map(|(wg, rows)| MatmulKernel::Gemv { ncols: 1, shape: GemvShape::new(wg, rows), q8 })
                })
                .collect();
        }
        g.throughput(Throughput::Bytes(format.tensor_bytes(n, k).unwrap() as u64));
        for plan in plans {
            let ds = matmul::prepare_with(&ctx, &mm, plan, "gemv").unwrap();
            g.bench_function(format!("{}/{plan}", format.name()), |b| {
                b.iter_custom(|iters| gpu_time(&ctx, &mut timer, &ds, iters))
            });
        }
    }
    g.finish();

    // GEMMs: TinyLlama's FFN, Llama-7B's FFN and 4096^3 (issue 12's shapes), GFLOP/s;
    // KILN_BENCH_GEMM_SHAPES=MxKxN,...: these instead (e.g. a model's prefill matmuls).
    let custom: Option<Vec<(usize, usize, usize)>> = std::env::var("KILN_BENCH_GEMM_SHAPES").ok().map(|v| {
        v.split(',')
            .filter_map(|s| {
                let d: Vec<usize> = s.split('x').filter_map(|t| t.trim().parse().ok()).collect();
                (d.len() == 3).then(|| (d[0], d[1], d[2]))
            })
            .collect()
    });
    let shapes: Vec<(usize, usize, usize)> = match custom {
        Some(s) => s,
        None if small() => vec![(128, 512, 1024)],
        None => vec![(512, 2048, 5632), (512, 4096, 11008), (4096, 4096, 4096)],
    };
    for (m, k, n) in shapes {
        let mut g = c.benchmark_group(format!("gemm_{m}x{k}x{n}"));
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
        for format in WeightFormat::ALL {
            // (Block formats need rows of whole blocks.)
            let Some(bytes) = format.tensor_bytes(n, k) else { continue };
            // The tensors and each plan's dispatches are made the first time a benchmark that
            // the filter lets through needs them: a sweep over several shapes otherwise spent
            // its time uploading and preparing every format and tile it would not run (H200,
            // run 411: a sweep of seven shapes filtered to two tiles stopped after the first
            // shape, most likely at its 250 s timeout).
            let data: OnceCell<(WeightTensor, wgpu::Buffer, wgpu::Buffer)> = OnceCell::new();
            let data = || {
                data.get_or_init(|| {
                    let w = weights(&ctx, format, n, k);
                    let x = ctx.upload_f32(&vec![0.01f32; m * k], "x").unwrap();
                    let y = ctx.storage((m * n * 4) as u64, "y").unwrap();
                    (w, x, y)
                })
            };
            let mm = || {
                let (w, x, y) = data();
                Matmul::dense(w, x, y, m as u32)
            };
            let mut plans = vec![plan_matmul(m as u32, n as u32, k as u32, format, &ctx.caps)];
            if std::env::var("KILN_BENCH_SWEEP").as_deref() == Ok("1") {
                plans = GemmTile::ALL.map(|tile| MatmulKernel::Gemm { tile }).to_vec();
                if ctx.caps.coopmat && !matches!(format, WeightFormat::F32 | WeightFormat::BF16) {
                    plans.extend(GemmTile::COOP.map(|tile| MatmulKernel::Gemm { tile }));
                }
                if ctx.caps.cm2 && kiln::plan::cm2_takes(m as u32, n as u32, k as u32, format) {
                    plans.push(MatmulKernel::Gemm { tile: GemmTile::Cm2 });
                }
            }
            // "elements" are floating-point operations: criterion prints them as elem/s.
            g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
            // Whether the weights fit one binding (one chunk), as the f16 copy's decoder needs.
            let one_chunk = bytes as u64 <= ctx.max_storage();
            for plan in plans {
                let ds: OnceCell<Vec<Dispatch>> = OnceCell::new();
                let ds = || ds.get_or_init(|| matmul::prepare_with(&ctx, &mm(), plan, "gemm").unwrap());
                g.bench_function(format!("{}/{plan}", format.name()), |b| {
                    let ds = ds();
                    b.iter_custom(|iters| gpu_time(&ctx, &mut timer, ds, iters))
                });
                // K-quants, whose prefill GEMMs may read an f16 copy of the weights
                // (`Caps::dequant_f16_from`): the copy's decoder alone, and the whole route.
                let quantized_gemm =
                    kiln::plan::dequant_f16_format(format) && matches!(plan, MatmulKernel::Gemm { .. });
                if quantized_gemm && ctx.caps.dequant_f16_from.is_some() && one_chunk {
                    let decode: OnceCell<(wgpu::Buffer, [Dispatch; 1])> = OnceCell::new();
                    g.bench_function(format!("{}/dequant_f16", format.name()), |b| {
                        let (_, decode) = decode.get_or_init(|| {
                            let halves = ctx.storage((n * k * 2) as u64, "f16 copy").unwrap();
                            let decode = [matmul::prepare_dequant_f16(&ctx, &data().0, &halves).unwrap()];
                            (halves, decode)
                        });
                        b.iter_custom(|iters| gpu_time(&ctx, &mut timer, decode, iters))
                    });
                    // Each beside the planner's GEMM as a session runs it (split along K where
                    // the planner splits).
                    let route: OnceCell<Vec<Dispatch>> = OnceCell::new();
                    g.bench_function(format!("{}/{plan} via f16 copy", format.name()), |b| {
                        let route = route.get_or_init(|| matmul::prepare_dequant(&ctx, &mm(), "gemm").unwrap());
                        b.iter_custom(|iters| gpu_time(&ctx, &mut timer, route, iters))
                    });
                    let planned: OnceCell<Vec<Dispatch>> = OnceCell::new();
                    g.bench_function(format!("{}/{plan} as planned", format.name()), |b| {
                        let planned = planned.get_or_init(|| matmul::prepare_planned(&ctx, &mm(), "gemm").unwrap());
                        b.iter_custom(|iters| gpu_time(&ctx, &mut timer, planned, iters))
                    });
                }
                // The cooperative GEMM's first dispatch rounds X to f16 (done by the runs
                // above): the GEMM alone, too (in sweeps as well, to compare tiles by it).
                if matches!(plan, MatmulKernel::Gemm { tile } if tile.is_coop()) {
                    let sweep = std::env::var("KILN_BENCH_SWEEP").as_deref() == Ok("1");
                    g.bench_function(format!("{}/{plan} alone", format.name()), |b| {
                        let ds = ds();
                        assert!(ds.len() > 1, "{plan}: no rounding dispatch in front of the GEMM");
                        b.iter_custom(|iters| gpu_time(&ctx, &mut timer, &ds[1..], iters))
                    });
                    // The sweep: also split along K, 2 and 4 ways (not the workgroup-scope tile,
                    // which has no partials epilogue).
                    if sweep && plan != (MatmulKernel::Gemm { tile: GemmTile::Cm2 }) {
                        for splits in [2u32, 4] {
                            let ds: OnceCell<Vec<Dispatch>> = OnceCell::new();
                            g.bench_function(format!("{}/{plan}/split{splits}", format.name()), |b| {
                                let ds = ds.get_or_init(|| {
                                    matmul::prepare_split(&ctx, &mm(), plan, splits, "gemm", false).unwrap()
                                });
                                b.iter_custom(|iters| gpu_time(&ctx, &mut timer, ds, iters))
                            });
                        }
                    }
                }
            }
        }
        g.finish();
    }
}

/// Prefill attention (flash attention: causal, f16 cache) of 512 and 4096 tokens at position
/// 0, and of 512 at position 3584 (the last step of a 4096-token prompt in steps of 512, where
/// Llama-7B's keys are split; `KILN_FLASH_SPLIT` forces a split), with TinyLlama's heads (64 dimensions, GQA groups of 8) and Llama-7B's
/// (128, no GQA); "elements" are the floating-point operations of Q·Kᵀ and P·V over the
/// causal part.
fn attention_benches(c: &mut Criterion) {
    use kiln::kernels::attention::{self, AttnShape};
    use kiln::kernels::flash_attention::{self, FlashArgs};
    use kiln::kernels::KvKind;
    let ctx = GpuContext::new(&ContextOptions::from_env().expect("env")).expect("GPU");
    let mut timer = PassTimer::new(&ctx, 1).expect("timestamps");
    let mut g = c.benchmark_group("attention_prefill");
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    let steps: &[(u32, u32)] = if small() { &[(64, 0), (256, 0)] } else { &[(512, 0), (4096, 0), (512, 3584)] };
    let heads = [("tinyllama", 32u32, 4u32, 64u32), ("llama-7b", 32, 32, 128)];
    for (model, n_head, n_kv_head, head_dim) in heads {
        for &(m, pos0) in steps {
            let shape = AttnShape { n_head, n_kv_head, head_dim, n_ctx: pos0 + m };
            let kv = KvKind::for_cache(true, &ctx.caps);
            let kv_bytes = ((pos0 + m) * shape.kv_stride()) as u64 * if kv == KvKind::F32 { 4 } else { 2 };
            let k_cache = ctx.storage(kv_bytes, "k").unwrap();
            let v_cache = ctx.storage(kv_bytes, "v").unwrap();
            let q = ctx.upload_f32(&vec![0.01f32; (m * shape.n_head * shape.head_dim) as usize], "q").unwrap();
            let out = ctx.storage((m * shape.n_head * shape.head_dim * 4) as u64, "out").unwrap();
            let a = FlashArgs { q: &q, k_cache: &k_cache, v_cache: &v_cache, out: &out, m, pos0 };
            let d = flash_attention::prepare(&ctx, kv, &shape, &a).unwrap();
            let pairs = m as u64 * (m as u64 + 1) / 2 + (m * pos0) as u64;
            g.throughput(Throughput::Elements(4 * pairs * (shape.n_head * shape.head_dim) as u64));
            let at = if pos0 > 0 { format!(" at {pos0}") } else { String::new() };
            g.bench_function(format!("flash/{model}/{m} tokens{at}/{kv:?}"), |b| {
                b.iter_custom(|iters| gpu_time(&ctx, &mut timer, &d, iters))
            });
        }
    }
    g.finish();

    // Decode attention (one query token over an f16 cache, with the combine pass where the
    // context is split) with TinyLlama's and Llama-7B's heads, at the contexts of a chat and
    // of `kiln bench -d 4096`; "bytes" are the K and V rows read. One layer's attention,
    // repeated back to back: its latency, which is what a decode step pays.
    let mut g = c.benchmark_group("attention_decode");
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    // TinyLlama's also at 16,384 positions (where sharing K/V reads among a GQA block may pay);
    // Llama-3-8B's (GQA groups of 4 at 128 dimensions) for the cooperative kernel's wider heads.
    let (short, long): (&[u32], &[u32]) =
        if small() { (&[100, 700], &[100, 700]) } else { (&[128, 512, 1024, 4096], &[128, 512, 1024, 4096, 16384]) };
    for (name, n_head, n_kv_head, head_dim, contexts) in
        [("tinyllama", 32u32, 4u32, 64u32, long), ("llama-7b", 32, 32, 128, short), ("llama3-8b", 32, 8, 128, short)]
    {
        let n_ctx = *contexts.iter().max().unwrap();
        let shape = AttnShape { n_head, n_kv_head, head_dim, n_ctx };
        let kv = KvKind::for_cache(true, &ctx.caps);
        let kv_bytes = (n_ctx * shape.kv_stride()) as u64 * if kv == KvKind::F32 { 4 } else { 2 };
        let k_cache = ctx.storage(kv_bytes, "k").unwrap();
        let v_cache = ctx.storage(kv_bytes, "v").unwrap();
        let q = ctx.upload_f32(&vec![0.01f32; (n_head * head_dim) as usize], "q").unwrap();
        let out = ctx.storage((n_head * head_dim * 4) as u64, "out").unwrap();
        let partial = ctx.storage(shape.decode_scratch_len() as u64 * 4, "partials").unwrap();
        for &kv_len in contexts {
            // The plain kernel, and the cooperative one where the adapter has it.
            for coop in [false, true] {
                if coop && !attention::decode_coop_takes(&ctx.caps, kv, &shape, kv_len) {
                    continue;
                }
                let choice =
                    if coop { attention::CoopChoice::Always { keys: None } } else { attention::CoopChoice::Never };
                let a = attention::DecodeArgs {
                    q: &q,
                    k_cache: &k_cache,
                    v_cache: &v_cache,
                    partial: &partial,
                    out: &out,
                    kv_len,
                    kv_base: 0,
                    columns: None,
                    block: None,
                    q8_out: None,
                    coop: choice,
                };
                let ds = attention::prepare_decode(&ctx, kv, &shape, &a).unwrap();
                g.throughput(Throughput::Bytes(kv_bytes / n_ctx as u64 * kv_len as u64 * 2));
                let kernel = match coop {
                    true => format!("coop {}", attention::decode_coop_keys(&shape, kv_len)),
                    false => format!("block {}", shape.decode_block(kv_len)),
                };
                g.bench_function(format!("{name}/{kv_len} positions/{kernel}/{} dispatches", ds.len()), |b| {
                    b.iter_custom(|iters| gpu_time(&ctx, &mut timer, &ds, iters))
                });
                // Split over the context: the split kernel and the combine pass, each alone.
                if ds.len() == 2 {
                    for (part, d) in [("splits", &ds[..1]), ("combine", &ds[1..])] {
                        g.bench_function(format!("{name}/{kv_len} positions/{kernel}/{part} alone"), |b| {
                            b.iter_custom(|iters| gpu_time(&ctx, &mut timer, d, iters))
                        });
                    }
                }
            }
        }
    }
    g.finish();
}

/// The sampler (one workgroup over a row of 32,000 logits, TinyLlama's vocabulary) per
/// setting: greedy, top-k alone, llama.cpp's default chain, and the chain with a repetition
/// penalty; on logits spread like a synthetic model's (normal, sigma 1.5) and like a trained
/// one's (a few dozen tokens well above a normal, sigma 3 bulk). Time per pick; for llama.cpp's
/// default chain also each of its two passes alone.
fn sample_benches(c: &mut Criterion) {
    use kiln::kernels::sample::{self, initial_state, SampleConfig};
    use kiln::sample::SamplerConfig;
    let ctx = GpuContext::new(&ContextOptions::from_env().expect("env")).expect("GPU");
    let mut timer = PassTimer::new(&ctx, 1).expect("timestamps");
    let mut g = c.benchmark_group("sample");
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    let n_vocab = 32000u32;
    // A deterministic normal from a hash (Box-Muller).
    let unit = |i: u64| ((i.wrapping_mul(0x9E3779B97F4A7C15) >> 40) as f64 + 0.5) / (1u64 << 24) as f64;
    let normal = |i: u64| (-2.0 * unit(2 * i).ln()).sqrt() * (std::f64::consts::TAU * unit(2 * i + 1)).cos();
    let flat: Vec<f32> = (0..n_vocab as u64).map(|i| (1.5 * normal(i)) as f32).collect();
    let peaked: Vec<f32> =
        (0..n_vocab as u64).map(|i| (3.0 * normal(i)) as f32 + if i % 997 == 0 { 12.0 } else { 0.0 }).collect();
    let settings = [
        ("greedy", SamplerConfig { temperature: 0.0, ..Default::default() }),
        ("top_k 40", SamplerConfig { top_p: 1.0, min_p: 0.0, ..Default::default() }),
        ("default", SamplerConfig::default()),
        ("default, repeat 1.1", SamplerConfig { repeat_penalty: 1.1, ..Default::default() }),
    ];
    let history: Vec<u32> = (0..64).map(|i| i * 131 % n_vocab).collect();
    for (dist, logits) in [("flat", &flat), ("peaked", &peaked)] {
        for (name, cfg) in &settings {
            let lb = ctx.upload_f32(logits, "logits").unwrap();
            let ids = ctx.storage(4, "ids").unwrap();
            let state = ctx.upload(bytemuck::cast_slice(&initial_state(0, &history, &[])), "state").unwrap();
            let k = SampleConfig::new(cfg, n_vocab, n_vocab);
            let d = sample::prepare(&ctx, &k, &lb, &ids, &state, 1).unwrap();
            g.bench_function(format!("{dist}/{name}"), |b| {
                b.iter_custom(|iters| gpu_time(&ctx, &mut timer, &d, iters))
            });
            // A sampled configuration's two passes, each alone (the second reads the slices'
            // results the runs above left): where a pick's time goes without cutting it short.
            if d.len() == 2 && *name == "default" {
                for (part, ds) in [("first pass", &d[..1]), ("second pass", &d[1..])] {
                    g.bench_function(format!("{dist}/{name}/{part} alone"), |b| {
                        b.iter_custom(|iters| gpu_time(&ctx, &mut timer, ds, iters))
                    });
                }
            }
        }
    }
    g.finish();
}

criterion_group!(kernels, benches, attention_benches, sample_benches);
criterion_main!(kernels);

//! Embedding gather, RoPE, RMSNorm, SiLU·mul, add, argmax, NLL scoring and attention against
//! their CPU references, on every test adapter (native, native with fallbacks, GL where present).

mod common;

use common::*;
use kiln::gpu::{run_dispatches, GpuContext, WeightTensor};
use kiln::kernels::attention::{self, AttnShape, DecodeArgs, PrefillArgs};
use kiln::kernels::elementwise::{self, EltOp};
use kiln::kernels::flash_attention::{self, FlashArgs};
use kiln::kernels::nll::{self, NllParams};
use kiln::kernels::rope::{self, RopeMode, RopeParams};
use kiln::kernels::{argmax, embed, norm, KvKind};
use kiln::quant::{dequantize, quantize, WeightFormat};

fn run(ctx: &GpuContext, ds: &[kiln::gpu::Dispatch]) {
    run_dispatches(ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
}

/// The GPU decoder reproduces ggml's dequantizer bit for bit on ggml's own blocks.
#[test]
fn gather_reproduces_ggml_dequantization_exactly() {
    let dir = testdata().join("qvectors");
    for g in gpus() {
        for (name, format) in [
            ("q8_0", WeightFormat::Q8_0),
            ("q4_K", WeightFormat::Q4K),
            ("q5_K", WeightFormat::Q5K),
            ("q6_K", WeightFormat::Q6K),
            ("f16", WeightFormat::F16),
            ("bf16", WeightFormat::BF16),
        ] {
            let blocks = std::fs::read(dir.join(format!("{name}.blocks.bin"))).expect("qvectors blocks");
            let want: Vec<f32> =
                bytemuck::pod_collect_to_vec(&std::fs::read(dir.join(format!("{name}.dequant.f32"))).unwrap());
            let (rows, k) = (16usize, 256usize);
            let table = WeightTensor::upload(&g.ctx, name, format, rows, k, &blocks).unwrap();
            // Every row, in a scrambled order with a repeat.
            let ids: Vec<u32> = vec![3, 0, 15, 8, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 3];
            let idb = g.ctx.upload(bytemuck::cast_slice(&ids), "ids").unwrap();
            let out = g.ctx.storage((ids.len() * k * 4) as u64, "out").unwrap();
            run(&g.ctx, &embed::prepare(&g.ctx, &table, &idb, &out, ids.len() as u32, k as u32).unwrap());
            let got = g.ctx.read_f32(&out, ids.len() * k).unwrap();
            let want_rows = embed::reference(&want, k, &ids);
            for (i, (a, b)) in got.iter().zip(&want_rows).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "[{}] {name}: element {i} (row {}, col {}): got {a}, ggml {b}",
                    g.name,
                    ids[i / k],
                    i % k
                );
            }
        }
    }
}

#[test]
fn gather_on_split_table() {
    let ctx = small_binding_gpu(2048);
    for format in [WeightFormat::F16, WeightFormat::Q8_0, WeightFormat::Q4K] {
        let (rows, k) = (40usize, if format.block_elems() == 1 { 70 } else { 256 });
        let vals = randn(&mut rng(3), rows * k, 1.0);
        let bytes = quantize(format, &vals).unwrap();
        let mut table_ref = vec![0f32; rows * k];
        dequantize(format, &bytes, rows * k, &mut table_ref).unwrap();
        let table = WeightTensor::upload(&ctx, "t", format, rows, k, &bytes).unwrap();
        assert!(table.chunks.len() > 2);
        let ids: Vec<u32> = vec![39, 0, 17, 21, 5, 39];
        let idb = ctx.upload(bytemuck::cast_slice(&ids), "ids").unwrap();
        let out = ctx.storage((ids.len() * k * 4) as u64, "out").unwrap();
        run(&ctx, &embed::prepare(&ctx, &table, &idb, &out, ids.len() as u32, k as u32).unwrap());
        let got = ctx.read_f32(&out, ids.len() * k).unwrap();
        assert_eq!(got, embed::reference(&table_ref, k, &ids), "split gather {}", format.name());
    }
}

#[test]
fn rms_norm_rows() {
    for g in gpus() {
        for (rows, n) in [(3usize, 64usize), (5, 1000), (2, 37)] {
            let mut r = rng(n as u64);
            let x = randn(&mut r, rows * n, 2.0);
            let w = randn(&mut r, n, 1.0);
            let (xb, wb) = (g.ctx.upload_f32(&x, "x").unwrap(), g.ctx.upload_f32(&w, "w").unwrap());
            let y = g.ctx.storage((rows * n * 4) as u64, "y").unwrap();
            let p = norm::RmsNormParams { n: n as u32, x_stride: n as u32, y_stride: n as u32, eps: 1e-5 };
            run(&g.ctx, &[norm::prepare(&g.ctx, &xb, &wb, &y, rows as u32, p, "norm").unwrap()]);
            let got = g.ctx.read_f32(&y, rows * n).unwrap();
            assert_close(&format!("[{}] rms_norm {rows}x{n}", g.name), &got, &norm::reference(&x, &w, n, 1e-5), 1e-5);
        }
    }
}

#[test]
fn elementwise_ops() {
    for g in gpus() {
        let n = 1003;
        let mut r = rng(7);
        let (a, b) = (randn(&mut r, n, 3.0), randn(&mut r, n, 1.0));
        let (ab, bb) = (g.ctx.upload_f32(&a, "a").unwrap(), g.ctx.upload_f32(&b, "b").unwrap());
        for op in [EltOp::SiluMul, EltOp::Add] {
            let out = g.ctx.storage((n * 4) as u64, "out").unwrap();
            run(&g.ctx, &[elementwise::prepare(&g.ctx, op, &ab, &bb, &out, n as u32, "elt").unwrap()]);
            let got = g.ctx.read_f32(&out, n).unwrap();
            assert_close(&format!("[{}] {op:?}", g.name), &got, &elementwise::reference(op, &a, &b), 1e-6);
        }
    }
}

#[test]
fn argmax_picks_lowest_index_of_maximum() {
    for g in gpus() {
        let (rows, n) = (4usize, 32000usize);
        let mut x = randn(&mut rng(11), rows * n, 1.0);
        x[5] = 50.0; // row 0: a single maximum
        x[n + 100] = 9.0; // row 1: tie, lowest index wins
        x[n + 31999] = 9.0;
        x[2 * n + 31999] = 60.0; // row 2: last element
        for v in &mut x[3 * n..] {
            *v = -1.0;
        } // row 3: all equal
        let xb = g.ctx.upload_f32(&x, "logits").unwrap();
        let ids = g.ctx.storage(16, "ids").unwrap();
        run(&g.ctx, &[argmax::prepare(&g.ctx, &xb, &ids, rows as u32, n as u32, n as u32).unwrap()]);
        let got = g.ctx.read_u32(&ids, rows).unwrap();
        assert_eq!(got, argmax::reference(&x, n), "[{}] argmax", g.name);
        assert_eq!(got, vec![5, 100, 31999, 0]);
    }
}

/// Each scored row's -log softmax at its target, on ragged shapes (rows and vocabularies
/// that are not multiples of the workgroup, a row stride wider than the row, a subrange of
/// rows written at an offset) and logits large enough that exp() would overflow unshifted.
#[test]
fn nll_scores_rows_against_reference() {
    for g in gpus() {
        // (rows, vocabulary, stride, first row scored, rows scored, output offset)
        for (rows, n, stride, row0, n_rows, out0) in [
            (5usize, 1000usize, 1003usize, 1u32, 3u32, 2u32),
            (3, 32000, 32000, 0, 3, 0),
            (9, 37, 40, 2, 7, 5),
            (2, 1, 1, 0, 2, 0),
        ] {
            let mut r = rng(n as u64 + rows as u64);
            let mut logits = randn(&mut r, rows * stride, 4.0);
            logits[stride + (3 % n)] = 95.0; // exp(95) is not an f32
            let targets: Vec<u32> = (0..rows).map(|i| ((i * 7919 + 13) % n) as u32).collect();
            let lb = g.ctx.upload_f32(&logits, "logits").unwrap();
            let tb = g.ctx.upload(bytemuck::cast_slice(&targets), "targets").unwrap();
            let len = (out0 + n_rows + 2) as usize;
            let ob = g.ctx.upload_f32(&vec![-1.0; len], "nll").unwrap();
            let p = NllParams { n: n as u32, stride: stride as u32, row0, n_rows, out0, _pad: [0; 3] };
            run(&g.ctx, &[nll::prepare(&g.ctx, &lb, &tb, &ob, p).unwrap()]);
            let got = g.ctx.read_f32(&ob, len).unwrap();
            let what = format!("[{}] nll {rows}x{n} (stride {stride}) rows {row0}..+{n_rows} at {out0}", g.name);
            let (before, rest) = got.split_at(out0 as usize);
            let (scored, after) = rest.split_at(n_rows as usize);
            assert!(before.iter().chain(after).all(|&v| v == -1.0), "{what}: wrote outside its results: {got:?}");
            assert_close(&what, scored, &nll::reference(&logits, &targets, &p), 2e-6);
        }
    }
}

fn rope_params(n_tokens: u32, n_heads: u32, head_dim: u32, n_rot: u32, pos0: u32) -> RopeParams {
    RopeParams {
        n_tokens,
        n_heads,
        head_dim,
        n_rot,
        pos0,
        src_stride: n_heads * head_dim,
        dst_stride: n_heads * head_dim,
        dst_offset: 0,
        freq_base: 10000.0,
        freq_scale: 0.5,
        _pad: [0; 2],
    }
}

/// Tolerance 2e-4: f32 angles at positions up to ~1000 against an f64 reference.
#[test]
fn rope_in_place_and_into_cache() {
    for g in gpus() {
        for mode in [RopeMode::Norm, RopeMode::Neox] {
            for (t, h, hd, nr, pos0) in [(5u32, 3u32, 16u32, 16u32, 0u32), (2, 4, 64, 32, 977)] {
                let p = rope_params(t, h, hd, nr, pos0);
                let x = randn(&mut rng(hd as u64), (t * h * hd) as usize, 1.0);
                let want = rope::reference(&x, mode, &p);
                let xb = g.ctx.upload_f32(&x, "x").unwrap();
                run(&g.ctx, &[rope::prepare_in_place(&g.ctx, mode, &xb, p, "rope").unwrap()]);
                let got = g.ctx.read_f32(&xb, x.len()).unwrap();
                let what = format!("[{}] rope {mode:?} t={t} h={h} hd={hd} rot={nr} pos0={pos0}", g.name);
                assert_close(&what, &got, &want, 2e-4);

                // The same rotation written into rows pos0.. of an f32 and an f16 cache.
                for f16_cache in [false, true] {
                    let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                    let rows = (pos0 + t) as usize;
                    let cache = g.ctx.storage(rows as u64 * (h * hd) as u64 * kv.bytes_per_elem(), "cache").unwrap();
                    let src = g.ctx.upload_f32(&x, "src").unwrap();
                    run(&g.ctx, &[rope::prepare_to_cache(&g.ctx, Some(mode), kv, &src, &cache, p, "kv").unwrap()]);
                    let off = pos0 as usize * (h * hd) as usize;
                    let got = read_cache(&g.ctx, &cache, kv, rows * (h * hd) as usize)[off..].to_vec();
                    let tol = if f16_cache { 2e-3 } else { 2e-4 };
                    assert_close(&format!("{what} -> {kv:?} cache"), &got, &want, tol);
                }
            }
        }
    }
}

fn read_cache(ctx: &GpuContext, buf: &wgpu::Buffer, kv: KvKind, n: usize) -> Vec<f32> {
    match kv {
        KvKind::F32 => ctx.read_f32(buf, n).unwrap(),
        _ => {
            let bytes = ctx.read_bytes(buf, 0, (n * 2) as u64).unwrap();
            bytes.chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
    }
}

fn cache_bytes(vals: &[f32], kv: KvKind) -> (Vec<u8>, Vec<f32>) {
    match kv {
        KvKind::F32 => (bytemuck::cast_slice(vals).to_vec(), vals.to_vec()),
        _ => {
            let h: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            (bytemuck::cast_slice(&h).to_vec(), h.iter().map(|v| v.to_f32()).collect())
        }
    }
}

/// Prefill (m queries at pos0..) and decode (one query) attention with GQA over f32 and f16
/// caches, against an f64 reference on the same cache values. Tolerance 1e-4.
#[test]
fn attention_prefill_and_decode() {
    for g in gpus() {
        for (nh, nkv, hd, n_ctx) in [(8u32, 2u32, 16u32, 300u32), (4, 4, 64, 40)] {
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
            for f16_cache in [false, true] {
                let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                let mut r = rng((nh * hd) as u64);
                let kvn = (n_ctx * nkv * hd) as usize;
                let (kb, k_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
                let (vb, v_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
                let k_cache = g.ctx.upload(&kb, "k").unwrap();
                let v_cache = g.ctx.upload(&vb, "v").unwrap();
                for (m, pos0) in [(7u32, 0u32), (13, n_ctx - 13 - 5), (1, n_ctx - 1)] {
                    let q = randn(&mut r, (m * nh * hd) as usize, 1.0);
                    let qb = g.ctx.upload_f32(&q, "q").unwrap();
                    let out = g.ctx.storage((m * nh * hd * 4) as u64, "out").unwrap();
                    let kv_len = pos0 + m;
                    let want = attention::reference(&shape, &q, &k_vals, &v_vals, m as usize, pos0 as usize);
                    let what = format!("[{}] attention nh={nh} kv={nkv} hd={hd} m={m} pos0={pos0} {kv:?}", g.name);

                    let scores = g.ctx.storage((nh * m * kv_len * 4) as u64, "scores").unwrap();
                    let pa = PrefillArgs {
                        q: &qb,
                        k_cache: &k_cache,
                        v_cache: &v_cache,
                        scores: &scores,
                        out: &out,
                        m,
                        pos0,
                    };
                    run(&g.ctx, &attention::prepare_prefill(&g.ctx, kv, &shape, &pa).unwrap());
                    let got = g.ctx.read_f32(&out, want.len()).unwrap();
                    assert_close(&format!("{what} prefill"), &got, &want, 1e-4);

                    if m == 1 {
                        let partial = g.ctx.storage(shape.decode_scratch_len() as u64 * 4, "partial").unwrap();
                        let da = DecodeArgs {
                            q: &qb,
                            k_cache: &k_cache,
                            v_cache: &v_cache,
                            partial: &partial,
                            out: &out,
                            kv_len,
                        };
                        run(&g.ctx, &attention::prepare_decode(&g.ctx, kv, &shape, &da).unwrap());
                        let got = g.ctx.read_f32(&out, want.len()).unwrap();
                        assert_close(&format!("{what} decode"), &got, &want, 1e-4);
                    }
                }
            }
        }
    }
}

/// Decode attention over the shapes of real models' head groups (GQA blocks of 1 to 8 query
/// heads per workgroup, head sizes 64 to 256, one that divides no block evenly) and context
/// lengths around its split size: one split (the kernel writes the output), two, and many
/// (split and combine), against the f64 reference. Tolerance 1e-4.
#[test]
fn decode_attention_blocks_and_splits() {
    for g in gpus() {
        // (heads, KV heads, head dim): TinyLlama, Llama-7B, Qwen3-0.6B, Qwen2.5-0.5B (group 7),
        // a 256-wide head, and a group of 16 (blocks of 8).
        for (nh, nkv, hd) in [(32u32, 4u32, 64u32), (8, 8, 128), (16, 8, 128), (14, 2, 64), (4, 2, 256), (16, 1, 32)] {
            let n_ctx = 600;
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
            // Long contexts: the GQA block's split size (short ones take one head a workgroup).
            let chunk = shape.decode_chunk(n_ctx);
            let kv = KvKind::for_cache(true, &g.ctx.caps);
            let mut r = rng((nh * hd + nkv) as u64);
            let kvn = (n_ctx * nkv * hd) as usize;
            let (kb, k_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
            let (vb, v_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
            let k_cache = g.ctx.upload(&kb, "k").unwrap();
            let v_cache = g.ctx.upload(&vb, "v").unwrap();
            let partial = g.ctx.storage(shape.decode_scratch_len() as u64 * 4, "partial").unwrap();
            for kv_len in [1, 5, chunk - 1, chunk, chunk + 1, 2 * chunk + 17, n_ctx] {
                let q = randn(&mut r, (nh * hd) as usize, 2.0);
                let qb = g.ctx.upload_f32(&q, "q").unwrap();
                let out = g.ctx.storage((nh * hd * 4) as u64, "out").unwrap();
                let want = attention::reference(&shape, &q, &k_vals, &v_vals, 1, kv_len as usize - 1);
                let da =
                    DecodeArgs { q: &qb, k_cache: &k_cache, v_cache: &v_cache, partial: &partial, out: &out, kv_len };
                let ds = attention::prepare_decode(&g.ctx, kv, &shape, &da).unwrap();
                assert_eq!(ds.len(), shape.decode_splits(kv_len).min(2) as usize, "one dispatch unless split");
                run(&g.ctx, &ds);
                let got = g.ctx.read_f32(&out, want.len()).unwrap();
                let what = format!(
                    "[{}] decode nh={nh} kv={nkv} hd={hd} block={} chunk={chunk} kv_len={kv_len}",
                    g.name,
                    shape.decode_block(kv_len)
                );
                assert_close(&what, &got, &want, 1e-4);
            }
        }
    }
}

/// Flash attention (prefill's one-dispatch attention) against the f64 reference on ragged
/// shapes: query counts that are not multiples of the 64-row tile (or of a GQA group's rows
/// in it), GQA groups 1 to 7, head dims of every variant class (and between classes), f32
/// and f16 caches, a prompt at position 0 and one appended to a cache at a nonzero position.
/// Tolerance 1e-4, as the other attention kernels.
#[test]
fn flash_attention_against_reference() {
    // (heads, KV heads, head dim, queries, position of the first)
    let cases = [
        (4u32, 4u32, 32u32, 1u32, 0u32),
        (4, 4, 32, 7, 0),
        (8, 4, 64, 65, 0),
        (8, 2, 64, 300, 0),
        (32, 4, 64, 70, 57),
        (4, 1, 128, 37, 100),
        (2, 2, 128, 130, 13),
        (8, 2, 16, 33, 200),
        (6, 3, 48, 100, 5),
        (4, 2, 256, 20, 30),
        (14, 2, 64, 9, 40),
        (8, 8, 128, 2, 1),
    ];
    for g in gpus() {
        for (i, &(nh, nkv, hd, m, pos0)) in cases.iter().enumerate() {
            let n_ctx = pos0 + m + 3;
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
            for f16_cache in [false, true] {
                let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                let mut r = rng(1000 + i as u64);
                let kvn = (n_ctx * nkv * hd) as usize;
                let (kb, k_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
                let (vb, v_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
                let k_cache = g.ctx.upload(&kb, "k").unwrap();
                let v_cache = g.ctx.upload(&vb, "v").unwrap();
                let q = randn(&mut r, (m * nh * hd) as usize, 1.0);
                let qb = g.ctx.upload_f32(&q, "q").unwrap();
                let out = g.ctx.storage((m * nh * hd * 4) as u64, "out").unwrap();
                let want = attention::reference(&shape, &q, &k_vals, &v_vals, m as usize, pos0 as usize);
                let fa = FlashArgs { q: &qb, k_cache: &k_cache, v_cache: &v_cache, out: &out, m, pos0 };
                run(&g.ctx, &[flash_attention::prepare(&g.ctx, kv, &shape, &fa).unwrap()]);
                let got = g.ctx.read_f32(&out, want.len()).unwrap();
                let what = format!("[{}] flash nh={nh} kv={nkv} hd={hd} m={m} pos0={pos0} {kv:?}", g.name);
                assert_close(&what, &got, &want, 1e-4);
            }
        }
    }
}

/// K rotated and V copied into their caches by the single combined dispatch.
#[test]
fn kv_write_rotates_k_and_copies_v() {
    for g in gpus() {
        for mode in [RopeMode::Norm, RopeMode::Neox] {
            for f16_cache in [false, true] {
                let (t, h, hd, pos0) = (3u32, 2u32, 16u32, 5u32);
                let p = rope_params(t, h, hd, hd, pos0);
                let n = (t * h * hd) as usize;
                let k = randn(&mut rng(21), n, 1.0);
                let v = randn(&mut rng(22), n, 1.0);
                let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                let rows = (pos0 + t) as usize;
                let bytes = rows as u64 * (h * hd) as u64 * kv.bytes_per_elem();
                let (kc, vc) = (g.ctx.storage(bytes, "k").unwrap(), g.ctx.storage(bytes, "v").unwrap());
                let (kb, vb) = (g.ctx.upload_f32(&k, "k").unwrap(), g.ctx.upload_f32(&v, "v").unwrap());
                run(&g.ctx, &[rope::prepare_kv_write(&g.ctx, mode, kv, &kb, &kc, &vb, &vc, p).unwrap()]);
                let off = pos0 as usize * (h * hd) as usize;
                let got_k = read_cache(&g.ctx, &kc, kv, rows * (h * hd) as usize)[off..].to_vec();
                let got_v = read_cache(&g.ctx, &vc, kv, rows * (h * hd) as usize)[off..].to_vec();
                let tol = if f16_cache { 2e-3 } else { 2e-4 };
                let what = format!("[{}] kv_write {mode:?} {kv:?}", g.name);
                assert_close(&format!("{what} K"), &got_k, &rope::reference(&k, mode, &p), tol);
                assert_close(&format!("{what} V"), &got_v, &v, if f16_cache { 1e-3 } else { 0.0 });
            }
        }
    }
}

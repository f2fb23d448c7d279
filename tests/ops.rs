//! Embedding gather, RoPE, RMSNorm, SiLU·mul, add, argmax, NLL scoring and attention against
//! their CPU references, on every test adapter (native, native with fallbacks, GL where present).

mod common;

use common::*;
use kiln::doctor::data::cache_bytes;
use kiln::doctor::ops::{self, rope_params, AttnCase};
use kiln::kernels::attention::{self, AttnShape};
use kiln::kernels::elementwise::{self, EltOp};
use kiln::kernels::flash_attention::{self, FlashArgs};
use kiln::kernels::nll::{self, NllParams};
use kiln::kernels::rope::{self, RopeMode};
use kiln::kernels::{argmax, embed, norm, KernelKey, KvKind};
use kiln::quant::{dequantize, quantize, WeightFormat};

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
            // Every row, in a scrambled order with a repeat.
            let ids: Vec<u32> = vec![3, 0, 15, 8, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 3];
            let got = ops::gather(&g.ctx, format, rows, k, &blocks, &ids).unwrap();
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
        let table = kiln::gpu::WeightTensor::upload(&ctx, "t", format, rows, k, &bytes).unwrap();
        assert!(table.chunks.len() > 2);
        let ids: Vec<u32> = vec![39, 0, 17, 21, 5, 39];
        let got = ops::gather(&ctx, format, rows, k, &bytes, &ids).unwrap();
        assert_eq!(got, embed::reference(&table_ref, k, &ids), "split gather {}", format.name());
    }
}

#[test]
fn rms_norm_rows() {
    for g in gpus() {
        // 4,101 and 4,100: rows longer than a workgroup loads in one round (8 values a lane).
        for (rows, n) in [(3usize, 64usize), (5, 1000), (2, 37), (2, 4101)] {
            let mut r = rng(n as u64);
            let x = randn(&mut r, rows * n, 2.0);
            let w = randn(&mut r, n, 1.0);
            let got = ops::rms_norm(&g.ctx, &x, &w, rows, n, 1e-5).unwrap();
            assert_close(&format!("[{}] rms_norm {rows}x{n}", g.name), &got, &norm::reference(&x, &w, n, 1e-5), 1e-5);
        }
    }
}

/// The norm writing halves (prefill's input of the cooperative GEMM with no to_half dispatch
/// after the norm): the very bits of the float norm's rows rounded by to_half, rows padded to
/// 8 with zeros.
#[test]
fn rms_norm_into_halves_equals_the_norm_then_to_half() {
    for g in gpus() {
        if !g.ctx.caps.f16 {
            continue;
        }
        for (rows, n) in [(3usize, 64usize), (5, 1000), (2, 36), (2, 4100)] {
            let mut r = rng(n as u64 + 1);
            let x = randn(&mut r, rows * n, 2.0);
            let w = randn(&mut r, n, 1.0);
            let floats = ops::rms_norm(&g.ctx, &x, &w, rows, n, 1e-5).unwrap();
            let want = ops::to_half(&g.ctx, &floats, rows, n, n).unwrap();
            let got = ops::rms_norm_halves(&g.ctx, &x, &w, rows, n, 1e-5).unwrap();
            assert_eq!(got, want, "[{}] rms_norm into halves {rows}x{n}", g.name);
        }
    }
}

/// Split-K's reduce folded into the norm after it (prefill's output and down projections
/// before the next norm): the residual exactly as the reduce pass adds it (partials in range
/// order, then the residual), and the very halves the f16 norm writes from that residual;
/// rows longer and shorter than a workgroup's round, not multiples of it.
#[test]
fn reduce_norm_equals_the_reduce_then_the_norm_into_halves() {
    for g in gpus() {
        if !g.ctx.caps.f16 {
            continue;
        }
        for (rows, n, splits) in [(3usize, 64usize, 2usize), (5, 1000, 3), (2, 2052, 1), (4, 4096, 4)] {
            let mut r = rng(n as u64 + splits as u64);
            let partials = randn(&mut r, splits * rows * n, 1.0);
            let y = randn(&mut r, rows * n, 2.0);
            let w = randn(&mut r, n, 1.0);
            let want_y: Vec<f32> =
                (0..rows * n).map(|i| (0..splits).fold(0.0f32, |v, s| v + partials[s * rows * n + i]) + y[i]).collect();
            let (got_y, got_h) = ops::reduce_norm(&g.ctx, &partials, &y, &w, rows, n, splits, 1e-5).unwrap();
            let what = format!("[{}] reduce_norm {rows}x{n}, {splits} ranges", g.name);
            let differ = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(differ(&got_y, &want_y), 0, "{what}: residual values unlike the reduce pass's");
            let want_h = ops::rms_norm_halves(&g.ctx, &want_y, &w, rows, n, 1e-5).unwrap();
            let differ_h = got_h.iter().zip(&want_h).filter(|(a, b)| a != b).count();
            assert!(got_h.len() == want_h.len() && differ_h == 0, "{what}: {differ_h} halves unlike the f16 norm's");
        }
    }
}

#[test]
fn to_half_rounds_rows_for_the_cooperative_gemm() {
    for g in gpus() {
        if !g.ctx.caps.f16 {
            continue;
        }
        // Ragged k (not a multiple of 8 nor 4 of the row's chunks), padded rows, values that
        // round, overflow f16 and fall below its normal range.
        for (m, k, x_stride) in [(3usize, 64usize, 64usize), (5, 37, 40), (2, 8, 12)] {
            let mut r = rng((m * k) as u64);
            let mut x = randn(&mut r, m * x_stride, 3.0);
            x[1] = 70000.0;
            x[2] = 1e-6;
            x[3] = -3.0e-8;
            let got = ops::to_half(&g.ctx, &x, m, k, x_stride).unwrap();
            let want = kiln::kernels::matmul::to_half_reference(&x, m, k, x_stride);
            assert_eq!(got, want, "[{}] to_half {m}x{k} stride {x_stride}", g.name);
        }
    }
}

#[test]
fn elementwise_ops() {
    for g in gpus() {
        let n = 1003;
        let mut r = rng(7);
        let (a, b) = (randn(&mut r, n, 3.0), randn(&mut r, n, 1.0));
        for op in [EltOp::SiluMul, EltOp::Add] {
            let got = ops::elementwise(&g.ctx, op, &a, &b).unwrap();
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
        let got = ops::argmax(&g.ctx, &x, rows, n).unwrap();
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
            let len = (out0 + n_rows + 2) as usize;
            let p = NllParams { n: n as u32, stride: stride as u32, row0, n_rows, out0, _pad: [0; 3] };
            let got = ops::nll(&g.ctx, &logits, &targets, p, len).unwrap();
            let what = format!("[{}] nll {rows}x{n} (stride {stride}) rows {row0}..+{n_rows} at {out0}", g.name);
            let (before, rest) = got.split_at(out0 as usize);
            let (scored, after) = rest.split_at(n_rows as usize);
            assert!(before.iter().chain(after).all(|&v| v == -1.0), "{what}: wrote outside its results: {got:?}");
            assert_close(&what, scored, &nll::reference(&logits, &targets, &p), 2e-6);
        }
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
                let got = ops::rope_in_place(&g.ctx, mode, &x, p).unwrap();
                let what = format!("[{}] rope {mode:?} t={t} h={h} hd={hd} rot={nr} pos0={pos0}", g.name);
                assert_close(&what, &got, &want, 2e-4);

                // The same rotation written into rows pos0.. of an f32 and an f16 cache.
                for f16_cache in [false, true] {
                    let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                    let got = ops::rope_to_cache(&g.ctx, mode, kv, &x, p).unwrap();
                    let tol = if f16_cache { 2e-3 } else { 2e-4 };
                    assert_close(&format!("{what} -> {kv:?} cache"), &got, &want, tol);
                }
            }
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
                let case = AttnCase::new(&g.ctx, shape, kv, &mut r).unwrap();
                for (m, pos0) in [(7u32, 0u32), (13, n_ctx - 13 - 5), (1, n_ctx - 1)] {
                    let q = randn(&mut r, (m * nh * hd) as usize, 1.0);
                    let want = case.reference(&q, m as usize, pos0 as usize);
                    let what = format!("[{}] attention nh={nh} kv={nkv} hd={hd} m={m} pos0={pos0} {kv:?}", g.name);
                    let got = case.prefill(&g.ctx, &q, m, pos0).unwrap();
                    assert_close(&format!("{what} prefill"), &got, &want, 1e-4);
                    if m == 1 {
                        let (got, _) = case.decode(&g.ctx, &q, pos0 + m).unwrap();
                        assert_close(&format!("{what} decode"), &got, &want, 1e-4);
                    }
                }
            }
        }
    }
}

/// Decode attention over the shapes of real models' head groups (head sizes 12 to 256, one
/// GQA group that divides no larger block) and context lengths around the split size: one
/// split (the kernel writes the output), two, and many (split and combine), with one query
/// head per workgroup (the planner's choice up to 2,048 positions) and the largest block of
/// heads sharing their K and V reads; every block at the longest context. Against the f64
/// reference. Tolerance 1e-4. Heads of a multiple of 32 dimensions also with the output
/// written as int8 blocks (`Caps::attn_q8_out`): the same float output, and blocks that
/// quantize it (`check_q8_blocks`). Just past one split, one head a workgroup takes wide
/// workgroups where the adapter runs them (`Caps::attn_decode_wide`): one dispatch. Also on a
/// context whose split steps merge their splits in their last workgroups (`merge_gpu`,
/// `Caps::decode_merge`): one dispatch at every context; and that merge with the other
/// choice of its fence after the count (`merge_other_fence_gpu`, `Caps::decode_merge_acquire`).
#[test]
fn decode_attention_blocks_and_splits() {
    for g in gpus().iter().chain(merge_gpu()).chain(merge_other_fence_gpu()) {
        let mut wide_runs = 0;
        let mut merged_runs = 0;
        // (heads, KV heads, head dim): TinyLlama, Llama-7B, Qwen3-0.6B, Qwen2.5-0.5B (group 7),
        // a 256-wide head, a group of 16, and heads of 12 (K rows read one value at a time).
        for (nh, nkv, hd) in
            [(32u32, 4u32, 64u32), (8, 8, 128), (16, 8, 128), (14, 2, 64), (4, 2, 256), (16, 1, 32), (6, 3, 12)]
        {
            // Llama-7B's heads also at 16 splits of 64, the most the plain kernel merges
            // (`DECODE_MERGE_MOST_SPLITS`): with the int8 output on subgroups of 8, one
            // invocation an output reads all 16 together (common/decode_merge.wgsl). Heads of
            // 32 too, at 16 splits of 256: where subgroups are 8 wide (lavapipe) their int8
            // output takes `merge_shuffled`, one invocation an output vector, at its most
            // splits.
            let n_ctx = match (nh, hd) {
                (8, 128) => 1024,
                (16, 32) => 16 * attention::chunk_of_class(32),
                _ => 600,
            };
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
            let chunk = shape.decode_chunk();
            let kv = KvKind::for_cache(true, &g.ctx.caps);
            let mut r = rng((nh * hd + nkv) as u64);
            let mut case = AttnCase::new(&g.ctx, shape, kv, &mut r).unwrap();
            let all: Vec<u32> = (1..=shape.largest_block()).filter(|&b| shape.takes_block(b)).collect();
            let wide = shape.decode_wide_chunk();
            for kv_len in [1, 5, chunk - 1, chunk, chunk + 1, wide, wide + 1, 2 * chunk + 17, n_ctx] {
                let blocks = if kv_len == n_ctx { all.clone() } else { vec![1, shape.largest_block()] };
                for block in blocks {
                    case.block = Some(block);
                    let q = randn(&mut r, (nh * hd) as usize, 2.0);
                    let want = case.reference(&q, 1, kv_len as usize - 1);
                    let (got, dispatches) = case.decode(&g.ctx, &q, kv_len).unwrap();
                    // One head a workgroup just past a split: wide workgroups, one dispatch.
                    let wide_takes = shape.decode_wide_takes(&g.ctx.caps, kv_len, block);
                    assert_eq!(
                        wide_takes,
                        g.ctx.caps.attn_decode_wide && block == 1 && kv_len > chunk && kv_len <= wide,
                        "wide workgroups"
                    );
                    wide_runs += wide_takes as usize;
                    // Split contexts take a combine pass unless their last workgroups merge them.
                    let merges = shape.decode_merges_at(&g.ctx.caps, shape.decode_splits(kv_len), false);
                    let want_dispatches =
                        if wide_takes || merges { 1 } else { shape.decode_splits(kv_len).min(2) as usize };
                    assert_eq!(dispatches, want_dispatches, "one dispatch unless split (merges: {merges})");
                    merged_runs += (merges && !wide_takes && shape.decode_splits(kv_len) > 1) as usize;
                    let what = format!(
                        "[{}] decode nh={nh} kv={nkv} hd={hd} block={block} chunk={chunk} kv_len={kv_len} wide={wide_takes}",
                        g.name
                    );
                    assert_close(&what, &got, &want, 1e-4);
                    // Heads of whole int8 blocks: the output also as the output projection's
                    // int8 input, by the kernel or by the combine pass (same float output).
                    if attention::takes_q8_out(&shape) {
                        let (got8, blocks, n) = case.decode_q8(&g.ctx, &q, kv_len).unwrap();
                        assert_eq!(n, dispatches, "{what}: int8 output, dispatches");
                        // A merge writes the int8 blocks alone (checked below against the float
                        // output); the others the same float output beside them.
                        if !(merges && shape.decode_splits(kv_len) > 1 && !wide_takes) {
                            assert_eq!(got8, got, "{what}: int8 output, float output");
                        }
                        if let Err(e) = kiln::doctor::matmul::check_q8_blocks(&blocks, &got) {
                            panic!("{what}: int8 output: {e}");
                        }
                    }
                }
            }
        }
        assert_eq!(wide_runs > 0, g.ctx.caps.attn_decode_wide, "[{}] wide workgroups ran where planned", g.name);
        assert_eq!(merged_runs > 0, g.ctx.caps.decode_merge, "[{}] splits merged themselves where planned", g.name);
        // Vulkan offers the @coherent binding the merge needs wherever it has subgroups.
        if g.name == "native-merge" && g.ctx.caps.subgroups && g.ctx.info.backend == wgpu::Backend::Vulkan {
            assert!(g.ctx.caps.decode_merge, "[{}] the merge runs where asked for", g.name);
        }
    }
}

/// One sequence's decode attention on cooperative matrices (the kernel long contexts take where
/// the adapter has them; skipped elsewhere), against the f64 reference: TinyLlama's,
/// Llama-7B's and Qwen2.5-0.5B's heads (GQA groups of 8, 1 and 7) and groups of 16 at 64 and
/// 128 dimensions; tiles of 16, 32 and 64 keys; contexts of one tile of 64 keys, a tile and one
/// key (a last tile moved back to end at the context, its first keys masked), one split and one
/// key, several splits with a ragged last one; keys growing along the context (scores of very
/// different sizes from tile to tile and split to split). Split always (the combine pass
/// normalizes, and writes the output projection's int8 blocks where asked). Tolerance 5e-3: Q
/// and the probabilities are rounded to f16, as in flash attention on cooperative matrices.
#[test]
fn decode_attention_on_cooperative_matrices() {
    for g in gpus().iter().chain(merge_gpu()).chain(merge_other_fence_gpu()) {
        for (nh, nkv, hd) in [(32u32, 4u32, 64u32), (8, 8, 128), (14, 2, 64), (16, 1, 64), (16, 1, 128)] {
            let n_ctx = 1100;
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
            let kv = KvKind::for_cache(true, &g.ctx.caps);
            if !attention::decode_coop_takes(&g.ctx.caps, kv, &shape, n_ctx) {
                continue;
            }
            let mut r = rng((nh * hd + nkv) as u64);
            let kvn = (n_ctx * nkv * hd) as usize;
            let mut k = randn(&mut r, kvn, 1.0);
            for (j, row) in k.chunks_mut((nkv * hd) as usize).enumerate() {
                row.iter_mut().for_each(|x| *x *= 1.0 + j as f32 / 256.0);
            }
            let (kb, k_vals) = cache_bytes(&k, kv);
            let (vb, v_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
            let k_cache = g.ctx.upload(&kb, "k").unwrap();
            let v_cache = g.ctx.upload(&vb, "v").unwrap();
            let partial = g.ctx.storage(shape.decode_scratch_len() as u64 * 4, "partials").unwrap();
            let width = nh * hd;
            let blocks = g.ctx.storage(kiln::kernels::matmul::q8_input_bytes(1, width), "int8 output").unwrap();
            for (keys, kv_len) in attention::DECODE_COOP_TILES.into_iter().flat_map(|keys| {
                let chunk = attention::DECODE_COOP_SUBGROUPS * keys;
                [64, 65, 100, chunk, chunk + 1, 3 * chunk + 77, n_ctx].map(|l| (keys, l))
            }) {
                let chunk = attention::DECODE_COOP_SUBGROUPS * keys;
                let q = randn(&mut r, width as usize, 1.0);
                let want = attention::reference(&shape, &q, &k_vals, &v_vals, 1, kv_len as usize - 1);
                let what = format!("[{}] coop decode nh={nh} kv={nkv} hd={hd} tiles of {keys} kv_len={kv_len}", g.name);
                let qb = g.ctx.upload_f32(&q, "q").unwrap();
                let q8 = attention::takes_q8_out(&shape);
                let splits = kv_len.div_ceil(attention::DECODE_COOP_SUBGROUPS * keys);
                let merges = shape.decode_merges_at(&g.ctx.caps, splits, true);
                // The float output, then where the heads make whole int8 blocks the output as
                // the output projection's int8 input: beside the same float output, or alone
                // where the splits merge themselves (common/decode_merge.wgsl's `merge_write`).
                let run = |q8_out: Option<&wgpu::Buffer>| {
                    let out = g.ctx.upload_f32(&vec![f32::NAN; want.len()], "out").unwrap();
                    let a = attention::DecodeArgs {
                        q: &qb,
                        k_cache: &k_cache,
                        v_cache: &v_cache,
                        partial: &partial,
                        out: &out,
                        kv_len,
                        kv_base: 0,
                        columns: None,
                        block: None,
                        q8_out,
                        coop: attention::CoopChoice::Always { keys: Some(keys) },
                    };
                    let ds = attention::prepare_decode(&g.ctx, kv, &shape, &a).unwrap();
                    // The cooperative kernel's grid (splits x KV heads), and the combine pass
                    // unless each KV head's last split merges them.
                    assert_eq!(ds.len(), if merges { 1 } else { 2 }, "{what}: dispatches");
                    assert_eq!(ds[0].workgroups, [kv_len.div_ceil(chunk), nkv, 1], "{what}: grid");
                    kiln::gpu::run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                    g.ctx.read_f32(&out, want.len()).unwrap()
                };
                let got = run(None);
                assert_close(&what, &got, &want, 5e-3);
                if q8 {
                    let got8 = run(Some(&blocks));
                    if merges {
                        assert!(got8.iter().all(|x| x.is_nan()), "{what}: a merge writes the int8 blocks alone");
                    } else {
                        assert_eq!(got8, got, "{what}: int8 output, float output");
                    }
                    let bytes = g.ctx.read_bytes(&blocks, 0, kiln::kernels::matmul::q8_input_bytes(1, width)).unwrap();
                    if let Err(e) = kiln::doctor::matmul::check_q8_blocks(&bytes, &got) {
                        panic!("{what}: int8 output: {e}");
                    }
                }
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
            check_flash(g, (nh, nkv, hd, m, pos0), 1000 + i as u64, 0.0);
        }
    }
}

/// Flash attention where a row's scores keep rising from one tile of keys to the next (keys
/// scaled up with their position), so the online softmax raises its max again and again
/// (the cooperative kernel rescales its output accumulators only when a tile's max exceeds
/// the last one by a margin: this takes that path many times, at 64 and 128 dimensions).
#[test]
fn flash_attention_with_scores_rising_along_the_context() {
    let cases = [(8u32, 2u32, 64u32, 300u32, 0u32), (32, 4, 64, 90, 200), (4, 4, 128, 260, 10), (2, 1, 128, 33, 300)];
    for g in gpus() {
        for (i, &case) in cases.iter().enumerate() {
            check_flash(g, case, 3000 + i as u64, 1.0 / 64.0);
        }
    }
}

/// One flash attention against the f64 reference: (heads, KV heads, head dim, queries,
/// position of the first), random Q, K and V of the seed (each key row scaled by
/// 1 + growth x its position), over an f32 and an f16 cache.
fn check_flash(g: &TestGpu, (nh, nkv, hd, m, pos0): (u32, u32, u32, u32, u32), seed: u64, growth: f32) {
    let n_ctx = pos0 + m + 3;
    let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
    for f16_cache in [false, true] {
        let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
        let mut r = rng(seed);
        let kvn = (n_ctx * nkv * hd) as usize;
        let mut k = randn(&mut r, kvn, 1.0);
        for (j, row) in k.chunks_mut((nkv * hd) as usize).enumerate() {
            row.iter_mut().for_each(|x| *x *= 1.0 + growth * j as f32);
        }
        let (kb, k_vals) = cache_bytes(&k, kv);
        let (vb, v_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
        let k_cache = g.ctx.upload(&kb, "k").unwrap();
        let v_cache = g.ctx.upload(&vb, "v").unwrap();
        let q = randn(&mut r, (m * nh * hd) as usize, 1.0);
        let qb = g.ctx.upload_f32(&q, "q").unwrap();
        let out = g.ctx.storage((m * nh * hd * 4) as u64, "out").unwrap();
        let want = attention::reference(&shape, &q, &k_vals, &v_vals, m as usize, pos0 as usize);
        let fa = FlashArgs { q: &qb, k_cache: &k_cache, v_cache: &v_cache, out: &out, m, pos0 };
        // On cooperative matrices Q and the probabilities are rounded to f16, as the
        // matrix cores take them (llama.cpp's coopmat flash attention does the same).
        let coop = flash_attention::takes_coop(kv, &shape, &g.ctx.caps);
        let tol = if coop { 5e-3 } else { 1e-4 };
        let planned = flash_attention::prepare(&g.ctx, kv, &shape, &fa).unwrap();
        kiln::gpu::run_dispatches(&g.ctx, &planned.iter().collect::<Vec<_>>()).unwrap();
        let got = g.ctx.read_f32(&out, want.len()).unwrap();
        let what = format!("[{}] flash nh={nh} kv={nkv} hd={hd} m={m} pos0={pos0} growth={growth} {kv:?}", g.name);
        assert_close(&what, &got, &want, tol);
        // The cooperative kernel with each row tile's keys split among 2 and 3 workgroups
        // (long contexts' plan), merged by the combine pass.
        if coop {
            for n in [2, 3] {
                let l = flash_attention::launch(kv, &shape, m, pos0, &g.ctx.caps, 0).unwrap();
                let l = flash_attention::split(l, &shape, n);
                let out = g.ctx.upload_f32(&vec![f32::NAN; want.len()], "out").unwrap();
                let fa = FlashArgs { out: &out, ..fa };
                let ds = flash_attention::prepare_launch(&g.ctx, &shape, &fa, &l).unwrap();
                kiln::gpu::run_dispatches(&g.ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                let got = g.ctx.read_f32(&out, want.len()).unwrap();
                let splits = l.params.n_split;
                assert_close(&format!("{what} split {n} ({splits} of {} keys)", l.params.split_keys), &got, &want, tol);
            }
        }
    }
}

/// The combine pass of a split flash attention against a CPU merge of the same partial
/// outputs: each row's splits weighted by 2^(max - the largest max), over the same weighted
/// sums; splits that showed a row no key (max -3e38; the kernel's sum and output for it then
/// count its masked keys, meaningless) weigh nothing.
#[test]
fn flash_combine_merges_split_partials() {
    use flash_attention::CombineParams;
    let (rows, d, n_split) = (37usize, 64usize, 3usize);
    let mut r = rng(77);
    let o = randn(&mut r, n_split * rows * d, 1.0);
    let mut ml = vec![0f32; n_split * rows * 4];
    let maxes = randn(&mut r, n_split * rows, 4.0);
    let sums = randn(&mut r, n_split * rows, 1.0);
    for s in 0..n_split {
        for row in 0..rows {
            let i = s * rows + row;
            // Every third row's last split showed it none of its keys: max -3e38, and a sum
            // and output (random here) that must not count.
            let empty = s == n_split - 1 && row % 3 == 0;
            ml[i * 4] = if empty { -3.0e38 } else { maxes[i] };
            ml[i * 4 + 1] = 1.0 + sums[i].abs() * 20.0;
        }
    }
    let mut want = vec![0f32; rows * d];
    for row in 0..rows {
        let mx = (0..n_split).map(|s| ml[(s * rows + row) * 4] as f64).fold(f64::MIN, f64::max);
        let w = |s: usize| (ml[(s * rows + row) * 4] as f64 - mx).exp2();
        let sum: f64 = (0..n_split).map(|s| w(s) * ml[(s * rows + row) * 4 + 1] as f64).sum();
        for c in 0..d {
            let acc: f64 = (0..n_split).map(|s| w(s) * o[(s * rows + row) * d + c] as f64).sum();
            want[row * d + c] = (acc / sum) as f32;
        }
    }
    for g in gpus() {
        let mut data = o.clone();
        data.extend_from_slice(&ml);
        let partial = g.ctx.upload_f32(&data, "partial").unwrap();
        let out = g.ctx.storage((rows * d * 4) as u64, "out").unwrap();
        let pipeline = g.ctx.pipeline(&KernelKey::FlashCombine).unwrap();
        let params = CombineParams { rows: rows as u32, d4: (d / 4) as u32, n_split: n_split as u32, _pad: 0 };
        let ub = g.ctx.uniform(&params, "combine");
        let bg = kiln::gpu::bind(&g.ctx, &pipeline, "combine", &[&ub, &partial, &out]);
        let groups = (rows * d / 4).div_ceil(kiln::kernels::WG_ELT as usize) as u32;
        let dispatch = kiln::gpu::Dispatch {
            label: "combine",
            pipeline,
            bind_group: bg,
            workgroups: [groups, 1, 1],
            params: Some(ub),
        };
        kiln::gpu::run_dispatches(&g.ctx, &[&dispatch]).unwrap();
        let got = g.ctx.read_f32(&out, rows * d).unwrap();
        assert_close(&format!("[{}] flash combine", g.name), &got, &want, 1e-5);
    }
}

/// Flash attention over several sequences' prompt chunks in one dispatch (a server's
/// prompts prefilled together): each chunk's queries sit one after another in Q and attend
/// causally over their own region of one shared cache, from their own position, as the f64
/// reference for that sequence alone says. Chunks of different lengths (so the grid's
/// surplus workgroups for the shorter ones must leave), regions in another order than the
/// chunks, one at position 0 and others appended to a cache.
#[test]
fn flash_attention_over_chunks_of_several_sequences() {
    use flash_attention::Chunk;
    // (heads, KV heads, head dim), then (queries, first position, region) per chunk.
    type Heads = (u32, u32, u32);
    type ChunkAt = (u32, u32, u32);
    let cases: [(Heads, &[ChunkAt]); 3] = [
        ((8, 2, 64), &[(70, 0, 2), (9, 30, 0), (33, 5, 1)]),
        ((4, 4, 32), &[(1, 3, 1), (17, 0, 0)]),
        ((32, 4, 64), &[(20, 11, 1), (65, 0, 3), (3, 60, 0), (40, 2, 2)]),
    ];
    for g in gpus() {
        for (i, &((nh, nkv, hd), chunks)) in cases.iter().enumerate() {
            let n_ctx = 140;
            let regions = chunks.iter().map(|c| c.2).max().unwrap() + 1;
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx };
            for f16_cache in [false, true] {
                let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                let mut r = rng(2000 + i as u64);
                let kvn = (regions * n_ctx * nkv * hd) as usize;
                let (kb, k_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
                let (vb, v_vals) = cache_bytes(&randn(&mut r, kvn, 1.0), kv);
                let k_cache = g.ctx.upload(&kb, "k").unwrap();
                let v_cache = g.ctx.upload(&vb, "v").unwrap();
                let m: u32 = chunks.iter().map(|c| c.0).sum();
                let row = (nh * hd) as usize;
                let q = randn(&mut r, m as usize * row, 1.0);
                let qb = g.ctx.upload_f32(&q, "q").unwrap();
                let out = g.ctx.storage((m as usize * row * 4) as u64, "out").unwrap();
                let fa = FlashArgs { q: &qb, k_cache: &k_cache, v_cache: &v_cache, out: &out, m: 0, pos0: 0 };
                let table: Vec<Chunk> =
                    chunks.iter().map(|c| Chunk { m: c.0, pos0: c.1, kv_base: c.2 * n_ctx }).collect();
                let (d, _chunks) = flash_attention::prepare_segments(&g.ctx, kv, &shape, &fa, &table).unwrap();
                kiln::gpu::run_dispatches(&g.ctx, &[&d]).unwrap();
                let got = g.ctx.read_f32(&out, m as usize * row).unwrap();
                let tol = if flash_attention::takes_coop(kv, &shape, &g.ctx.caps) { 5e-3 } else { 1e-4 };
                let region = (n_ctx * nkv * hd) as usize;
                let mut row0 = 0usize;
                for (j, &(cm, pos0, reg)) in chunks.iter().enumerate() {
                    let cm = cm as usize;
                    let at = reg as usize * region;
                    let want = attention::reference(
                        &shape,
                        &q[row0 * row..(row0 + cm) * row],
                        &k_vals[at..at + region],
                        &v_vals[at..at + region],
                        cm,
                        pos0 as usize,
                    );
                    let what = format!("[{}] flash chunks case {i} chunk {j} {kv:?}", g.name);
                    assert_close(&what, &got[row0 * row..(row0 + cm) * row], &want, tol);
                    row0 += cm;
                }
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
                let (got_k, got_v) = ops::kv_write(&g.ctx, mode, kv, &k, &v, p).unwrap();
                let tol = if f16_cache { 2e-3 } else { 2e-4 };
                let what = format!("[{}] kv_write {mode:?} {kv:?}", g.name);
                assert_close(&format!("{what} K"), &got_k, &rope::reference(&k, mode, &p), tol);
                assert_close(&format!("{what} V"), &got_v, &v, if f16_cache { 1e-3 } else { 0.0 });
            }
        }
    }
}

/// A batched decode step's attention: one query per column, each over its own sequence's
/// region of one shared cache (regions in another order than the columns), at its own
/// position, short and split contexts side by side (columns of one split beside split ones,
/// which the combine pass must leave alone); and the single-sequence kernel over a region
/// that does not start at row 0. Against the f64 reference on each region. Tolerance 1e-4.
#[test]
fn decode_attention_over_columns_of_a_shared_cache() {
    let region = 300u32;
    let cols = AttnCase::shared_cache_columns(region);
    for g in gpus() {
        // stories260K's heads (GQA 2, head dim 8) over an f32 and an f16 cache, TinyLlama's
        // (GQA 8, 128 positions a split) over an f16 cache: one head per workgroup and the
        // whole GQA group per workgroup.
        for (nh, nkv, hd, caches) in [(8u32, 4u32, 8u32, &[false, true][..]), (32, 4, 64, &[true][..])] {
            let shape = AttnShape { n_head: nh, n_kv_head: nkv, head_dim: hd, n_ctx: region * 5 };
            for (&f16_cache, block) in caches.iter().flat_map(|c| [(c, 1), (c, nh / nkv)]) {
                let kv = KvKind::for_cache(f16_cache, &g.ctx.caps);
                let mut r = rng((nh * hd + nkv) as u64 + 77);
                let mut case = AttnCase::new(&g.ctx, shape, kv, &mut r).unwrap();
                case.block = Some(block);
                for m in [1usize, 2, 5] {
                    let q = randn(&mut r, m * (nh * hd) as usize, 2.0);
                    let want: Vec<f32> =
                        cols[..m].iter().enumerate().flat_map(|(c, col)| case.reference_column(&q, c, col)).collect();
                    let (got, _) = case.decode_columns(&g.ctx, &q, region, &cols[..m], true).unwrap();
                    let what = format!(
                        "[{}] batched decode nh={nh} kv={nkv} hd={hd} block={block} columns={m} {kv:?}",
                        g.name
                    );
                    assert_close(&what, &got, &want, 1e-4);
                }
                // One sequence in slot 4's region, at its last row.
                let q = randn(&mut r, (nh * hd) as usize, 2.0);
                let (got, _) = case.decode_columns(&g.ctx, &q, region, &cols[2..3], false).unwrap();
                let what = format!("[{}] decode in a region nh={nh} kv={nkv} hd={hd} block={block} {kv:?}", g.name);
                assert_close(&what, &got, &case.reference_column(&q, 0, &cols[2]), 1e-4);
            }
        }
    }
}

/// Weight uploads land byte for byte in the GPU layout when the staging memory is filled by
/// several threads: tensors of a few MiB each (split among the threads), contiguous and
/// gathered from rows of two tensors, repacked (Q8_0, Q6_K) or not (Q4_K), enough of them
/// that writes straddle the belt's staging buffers.
#[test]
fn large_uploads_land_byte_for_byte() {
    use kiln::gpu::WeightTensor;
    use kiln::quant::repack_for_gpu;
    let g = &gpus()[0];
    let bytes = |n: usize, seed: u64| -> Vec<u8> {
        (0..n as u64).map(|i| ((i ^ seed).wrapping_mul(0x9E3779B97F4A7C15) >> 56) as u8).collect()
    };
    let mut uploaded = Vec::new();
    for round in 0..2u64 {
        for format in [WeightFormat::Q4K, WeightFormat::Q6K, WeightFormat::Q8_0] {
            let (rows, k) = (2048usize, 2048usize);
            let row_bytes = format.row_bytes(k).unwrap();
            let data = bytes(rows * row_bytes, round * 7 + format as u64);
            let w = WeightTensor::upload_deferred(&g.ctx, "contiguous", format, rows, k, &data).unwrap();
            uploaded.push((w, repack_for_gpu(format, &data).unwrap()));
            // Rows interleaved from two tensors, as the gate/up matrix is built.
            let (a, b) = (bytes(rows / 2 * row_bytes, 100 + round), bytes(rows / 2 * row_bytes, 200 + round));
            let row = |r: usize| {
                let t = if r % 2 == 0 { &a } else { &b };
                &t[r / 2 * row_bytes..(r / 2 + 1) * row_bytes]
            };
            let w = WeightTensor::upload_rows_deferred(&g.ctx, "gathered", format, rows, k, &row).unwrap();
            let gguf: Vec<u8> = (0..rows).flat_map(|r| row(r).to_vec()).collect();
            uploaded.push((w, repack_for_gpu(format, &gguf).unwrap()));
        }
    }
    g.ctx.finish_uploads().unwrap();
    for (w, want) in &uploaded {
        assert_eq!(w.chunks.len(), 1, "{} {:?}: one chunk", w.name, w.format);
        let got = g.ctx.read_bytes(&w.chunks[0].buffer, 0, want.len() as u64).unwrap();
        let first_bad = got.iter().zip(want).position(|(x, y)| x != y);
        assert!(first_bad.is_none(), "{} {:?}: byte {first_bad:?} differs", w.name, w.format);
    }
}

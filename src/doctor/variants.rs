//! Which kernel variants kiln can run on an adapter: asked of the planner itself, over the
//! shapes of the models kiln knows, so the doctor compiles what this adapter would run and
//! nothing else.

use crate::gpu::Caps;
use crate::kernels::attention::AttnShape;
use crate::kernels::ATTN_DECODE_MAX_BLOCK;
use crate::plan::{plan_matmul, MatmulKernel, GEMV_MAX_COLS};
use crate::quant::WeightFormat;
use crate::synth::PRESETS;

/// Matrix shapes (rows n, row length k) the planner is asked about: every matrix of kiln's
/// presets (TinyLlama, Llama-7B, Qwen3 and the small ones; Q/K/V and gate/up stacked as the
/// engine stacks them), and sizes on both sides of each of its thresholds.
fn matrix_shapes() -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for p in PRESETS {
        let (e, ff, q, kv) = (p.n_embd, p.n_ff, p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        v.extend([(q, e), (kv, e), (q + 2 * kv, e), (e, q), (ff, e), (2 * ff, e), (e, ff), (p.n_vocab, e)]);
    }
    for n in [64, 127, 128, 256, 512, 513, 2048, 8191, 8192, 16383, 16384, 65536] {
        for k in [256, 2048, 8192] {
            v.push((n, k));
        }
    }
    v
}

/// Tokens per matmul the planner is asked about: each GEMV width, and prefill batches around
/// the GEMM's thresholds.
fn batch_sizes() -> Vec<u32> {
    (1..=GEMV_MAX_COLS).chain([GEMV_MAX_COLS + 1, 32, 63, 64, 128, 512, 2048]).collect()
}

/// Every matmul kernel the planner picks for weights of `format` on an adapter with `caps`,
/// GEMVs first (by width), then GEMMs.
pub fn planned_matmuls(format: WeightFormat, caps: &Caps) -> Vec<MatmulKernel> {
    let mut v: Vec<MatmulKernel> = Vec::new();
    for m in batch_sizes() {
        for (n, k) in matrix_shapes() {
            let kernel = plan_matmul(m, n, k, format, caps);
            if !v.contains(&kernel) {
                v.push(kernel);
            }
        }
    }
    let order = |k: &MatmulKernel| match *k {
        MatmulKernel::Gemv { ncols, shape, q8 } => (0, q8 as u32, ncols, shape.wg * 16 + shape.rows),
        MatmulKernel::Gemm { tile } => (1, tile.is_coop() as u32, tile.dims().0, tile.dims().1),
    };
    v.sort_by_key(order);
    v
}

/// Which GEMV widths (activation columns) a check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Widths {
    All,
    /// One column (decode) and the most.
    Ends,
    /// The ends and the i-th width between them (cycling): checks of several formats, each
    /// passing its own index, run every width between them.
    EndsAnd(usize),
}

/// `kernels` with their GEMVs cut to `widths` (each launch shape and kind apart); GEMMs stay.
pub fn gemv_widths(kernels: &[MatmulKernel], widths: Widths) -> Vec<MatmulKernel> {
    let width = |k: &MatmulKernel| match k {
        MatmulKernel::Gemv { ncols, q8, .. } => Some((*q8, *ncols)),
        MatmulKernel::Gemm { .. } => None,
    };
    let kept = |q8: bool, ncols: u32| {
        let mut all: Vec<u32> = kernels.iter().filter_map(width).filter(|w| w.0 == q8).map(|w| w.1).collect();
        all.sort();
        all.dedup();
        let (first, last) = (all.first().copied(), all.last().copied());
        let between: Vec<u32> = all.iter().copied().filter(|w| Some(*w) != first && Some(*w) != last).collect();
        let middle = match widths {
            Widths::EndsAnd(i) if !between.is_empty() => Some(between[i % between.len()]),
            _ => None,
        };
        widths == Widths::All || Some(ncols) == first || Some(ncols) == last || Some(ncols) == middle
    };
    kernels.iter().copied().filter(|k| width(k).is_none_or(|(q8, n)| kept(q8, n))).collect()
}

/// Decode attention shapes whose GQA groups are each of its workgroup blocks (1 to 8 query
/// heads sharing a KV head's reads: GQA groups of 1 to 8, head size 64), with room for a
/// context of `n_ctx` (several splits).
pub fn decode_attention_shapes(n_ctx: u32) -> Vec<AttnShape> {
    (1..=ATTN_DECODE_MAX_BLOCK)
        .map(|group| AttnShape { n_head: 2 * group, n_kv_head: 2, head_dim: 64, n_ctx })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{GemmTile, GemvShape};

    fn gpu() -> Caps {
        Caps { subgroups: true, f16: true, ..Caps::baseline() }
    }

    #[test]
    fn cpu_adapters_run_one_gemv_shape_per_width_and_small_tiles() {
        let cpu = Caps { cpu_adapter: true, int8_dot: true, ..gpu() };
        let got = planned_matmuls(WeightFormat::Q4K, &cpu);
        let mut want: Vec<MatmulKernel> =
            (1..=8).map(|ncols| MatmulKernel::Gemv { ncols, shape: GemvShape::new(64, 4), q8: false }).collect();
        want.push(MatmulKernel::Gemm { tile: GemmTile::T32 });
        assert_eq!(got, want);
    }

    #[test]
    fn gpus_get_every_launch_shape_int8_and_matrix_cores_where_offered() {
        let plain = planned_matmuls(WeightFormat::Q4K, &gpu());
        let gemv_shapes: Vec<(u32, u32, u32)> = plain
            .iter()
            .filter_map(|k| match k {
                MatmulKernel::Gemv { ncols: 1, shape, .. } => Some((shape.wg, shape.rows, shape.groups)),
                _ => None,
            })
            .collect();
        // One column: 128 x 2, 256 x 2 (few rows, long rows) and row groups (many rows).
        assert_eq!(gemv_shapes, vec![(128, 2, 1), (256, 2, 1), (256, 4, 4)]);
        assert_eq!(plain.iter().filter(|k| matches!(k, MatmulKernel::Gemv { .. })).count(), 24);
        let tiles: Vec<GemmTile> = plain
            .iter()
            .filter_map(|k| match k {
                MatmulKernel::Gemm { tile } => Some(*tile),
                _ => None,
            })
            .collect();
        assert_eq!(tiles, vec![GemmTile::T32, GemmTile::T64, GemmTile::T128x64]);
        assert!(planned_matmuls(WeightFormat::F32, &gpu()).contains(&MatmulKernel::Gemm { tile: GemmTile::T64x128 }));

        let full = planned_matmuls(WeightFormat::Q6K, &Caps { int8_dot: true, coopmat: true, ..gpu() });
        let q8 = full.iter().filter(|k| matches!(k, MatmulKernel::Gemv { q8: true, .. })).count();
        // Widths 1-2 at three launch shapes (by rows: 128x2, 128x4 from 4,096, 64x4 from
        // 8,192); from GEMV_Q8_WIDE_MIN_COLS columns the grouped shapes (two: by how many
        // workgroups a matrix makes), widths 3-8.
        assert_eq!(q8, 18, "widths 1-2 at three launch shapes, 3-8 on two grouped shapes");
        assert!(full.contains(&MatmulKernel::Gemv { ncols: 2, shape: GemvShape::new(64, 4), q8: true }));
        let wide = crate::plan::GEMV_Q8_WIDE;
        assert!(full.contains(&MatmulKernel::Gemv { ncols: crate::plan::GEMV_Q8_WIDE_COLS, shape: wide, q8: true }));
        assert!(full.contains(&MatmulKernel::Gemm { tile: GemmTile::Coop64 }));
        // Float weights never take the int8 GEMV; F16 ones take matrix cores, F32 never.
        let f16 = planned_matmuls(WeightFormat::F16, &Caps { int8_dot: true, coopmat: true, ..gpu() });
        assert!(!f16.iter().any(|k| matches!(k, MatmulKernel::Gemv { q8: true, .. })));
        assert!(f16.contains(&MatmulKernel::Gemm { tile: GemmTile::Coop64 }));
        let f32 = planned_matmuls(WeightFormat::F32, &Caps { int8_dot: true, coopmat: true, ..gpu() });
        assert!(!f32.iter().any(|k| matches!(k, MatmulKernel::Gemm { tile } if tile.is_coop())));
    }

    #[test]
    fn fewer_widths_still_cover_every_width_over_the_formats() {
        let planned = planned_matmuls(WeightFormat::Q4K, &gpu());
        assert_eq!(gemv_widths(&planned, Widths::All), planned);
        let widths = |ks: Vec<MatmulKernel>| -> Vec<u32> {
            let mut w: Vec<u32> = ks
                .iter()
                .filter_map(|k| if let MatmulKernel::Gemv { ncols, .. } = k { Some(*ncols) } else { None })
                .collect();
            w.sort();
            w.dedup();
            w
        };
        assert_eq!(widths(gemv_widths(&planned, Widths::Ends)), vec![1, 8]);
        assert_eq!(widths(gemv_widths(&planned, Widths::EndsAnd(0))), vec![1, 2, 8]);
        assert_eq!(widths(gemv_widths(&planned, Widths::EndsAnd(6))), vec![1, 2, 8], "cycles");
        let mut all: Vec<u32> = (0..6).flat_map(|i| widths(gemv_widths(&planned, Widths::EndsAnd(i)))).collect();
        all.sort();
        all.dedup();
        assert_eq!(all, (1..=8).collect::<Vec<_>>());
        // Every launch shape keeps its widths; the GEMMs stay.
        let kept = gemv_widths(&planned, Widths::EndsAnd(3));
        assert_eq!(kept.iter().filter(|k| matches!(k, MatmulKernel::Gemv { .. })).count(), 9);
        assert_eq!(kept.iter().filter(|k| matches!(k, MatmulKernel::Gemm { .. })).count(), 3);
    }

    #[test]
    fn decode_shapes_cover_every_block() {
        let shapes = decode_attention_shapes(600);
        // Each shape's whole GQA group is a block the kernel takes: 1 to 8 heads.
        let blocks: Vec<u32> = shapes.iter().map(|s| s.largest_block()).collect();
        assert_eq!(blocks, (1..=ATTN_DECODE_MAX_BLOCK).collect::<Vec<_>>());
        assert!(shapes.iter().all(|s| s.takes_block(s.group())));
        // Past one split's positions the context splits; up to it, it does not.
        let short = shapes[0].decode_chunk();
        assert!(shapes.iter().all(|s| s.decode_splits(short + 1) > 1 && s.decode_splits(short) == 1));
        // The planner takes one head per workgroup up to DECODE_SHARE_FROM, past it the largest
        // divisor of the group up to 4 (groups 1 to 8).
        let far = crate::kernels::attention::DECODE_SHARE_FROM + 1;
        let deep: Vec<AttnShape> = shapes.iter().map(|s| AttnShape { n_ctx: far, ..*s }).collect();
        assert!(deep.iter().all(|s| s.decode_block(far - 1) == 1));
        let shared: Vec<u32> = deep.iter().map(|s| s.decode_block(far)).collect();
        assert_eq!(shared, vec![1, 2, 3, 4, 1, 3, 1, 4]);
    }
}

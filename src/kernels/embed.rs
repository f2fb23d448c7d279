//! Embedding lookup: gathers rows of a (quantized) table by token id, dequantizing them.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::{bind, grid, Dispatch, GpuContext, WeightTensor};
use crate::kernels::{KernelKey, WG_ELT};

/// Mirrors `Params` in embed.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct EmbedParams {
    pub n_tokens: u32,
    pub k: u32,
    pub row_start: u32,
    pub n_rows: u32,
    pub out_stride: u32,
    pub _pad: [u32; 3],
}

/// out[t, 0..k] = table[ids[t]] for t < n_tokens; one dispatch per table chunk.
pub fn prepare(
    ctx: &GpuContext,
    table: &WeightTensor,
    ids: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n_tokens: u32,
    out_stride: u32,
) -> Result<Vec<Dispatch>> {
    let key = KernelKey::Embed { format: table.format };
    let pipeline = ctx.pipeline(&key)?;
    let threads = n_tokens * table.k.div_ceil(8);
    table
        .chunks
        .iter()
        .map(|chunk| {
            let params = EmbedParams {
                n_tokens,
                k: table.k,
                row_start: chunk.row_start,
                n_rows: chunk.rows,
                out_stride,
                _pad: [0; 3],
            };
            let ub = ctx.uniform(&params, "embed");
            let bg = bind(ctx, &pipeline, "embed", &[&ub, &chunk.buffer, ids, out]);
            Ok(Dispatch {
                label: "embed",
                pipeline: pipeline.clone(),
                bind_group: bg,
                workgroups: grid(threads.div_ceil(WG_ELT)),
                params: Some(ub),
            })
        })
        .collect()
}

/// CPU reference: rows of an already-dequantized table.
pub fn reference(table: &[f32], k: usize, ids: &[u32]) -> Vec<f32> {
    ids.iter().flat_map(|&id| table[id as usize * k..(id as usize + 1) * k].iter().copied()).collect()
}

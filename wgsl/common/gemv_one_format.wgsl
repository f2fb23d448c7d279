// A GEMV over one weight format: every row of the chunk from binding 1 (gemv.wgsl and
// gemv_q8.wgsl call row_sums; common/gemv_two_formats.wgsl is the other choice).
fn row_sums(row0: u32, lane: Lane) -> GemvSums { return gemv_sums(row0, p.n_rows - 1u, lane); }

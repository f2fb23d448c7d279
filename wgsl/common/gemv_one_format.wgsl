// A GEMV over one weight format: every row of the chunk from binding 1 (gemv.wgsl and
// gemv_q8.wgsl call gemv_workgroup; common/gemv_two_formats.wgsl is the other choice).
fn gemv_workgroup(row0: u32, lane: Lane) { gemv_rows(row0, p.n_rows - 1u, row0, lane); }

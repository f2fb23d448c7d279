//! The GEMM on workgroup-scope cooperative matrices with tensor-addressed loads
//! (VK_NV_cooperative_matrix2 and VK_NV_tensor_addressing: NVIDIA's Vulkan driver), for F16
//! weights: Y[m, n] = X[m, k] · W[n, k]ᵀ (+ Y). A workgroup computes one BM x BN tile as one
//! matrix the whole workgroup holds; each K step loads its A (BM x BK of X) and B (BK x BN of
//! W, through a transposing tensor view) straight from the storage buffers, and the driver
//! stages and pipelines the loads itself: no workgroup memory, no barriers in kiln's code.
//! H200, F16 4096^3 alone (kernels bench, run 501): 520.8 µs, 263.9 TFLOP/s, where the
//! subgroup-scope GEMM (gemm_coop.wgsl, 256x128x16) takes 645.9.
//!
//! WGSL cannot say any of this (naga has no workgroup scope and no tensor addressing), so the
//! kernel is written here as SPIR-V, passed through to the driver (wgpu's PASSTHROUGH_SHADERS)
//! on a device opened with the extension (`gpu::cm2`). Its GLSL reference is
//! profiling/cm2/gemm_tensor.comp (`examples/coopmat2_lab.rs` runs either). What the driver's
//! speed depends on, measured in the lab (runs 493-501):
//! - the loads address each buffer from its first element, the tile a slice of a layout of
//!   the whole matrix: from the tile's first element instead, 45 TFLOP/s (run 495);
//! - the K loop counts iterations (`i < k / (BK · UNROLL)`): looping over k itself took 611 µs
//!   against 515 (run 500);
//! - 128x256x64 with two K steps an iteration and tiles in bands of 8 rows: the best of the
//!   sweep (run 494; 256x128 tiles 1,131-1,260 µs, 128x128x64 581-611, K steps of 128 or
//!   unrolled four times lose too).
//!
//! The declarations follow glslang's (a block type per read-only buffer, each load's Object the
//! matrix loaded before it); neither changed the time (run 498).
//!
//! Bindings are the cooperative GEMM's (`Binding` list of `KernelKey::Gemm`): 0 the matmul
//! parameters (common/matmul_params.wgsl), 1 W as halves, 2 X as halves (rows of x_stride), 3 Y.
//! It takes whole tiles only, K a multiple of BK · UNROLL and rows of X and W 16-byte aligned
//! (`plan::cm2_takes`); the epilogue is Y's plain write, Y's tile added after the K loop where
//! `accumulate` is set (the residual add), no bias.

/// Tile: BM rows of X (tokens), BN rows of W (outputs), BK a K step.
pub const BM: u32 = 128;
pub const BN: u32 = 256;
pub const BK: u32 = 64;
/// Invocations a workgroup (the driver's limit for workgroup-scope matrices on an H200).
pub const WG: u32 = 256;
/// K steps a loop iteration.
pub const UNROLL: u32 = 2;
/// Tiles are visited GROUP rows of tiles at a time, column by column, for L2 reuse.
pub const GROUP: u32 = 8;

// Opcodes, enumerants (SPIR-V 1.6 unified headers).
const OP_UNDEF: u32 = 1;
const OP_EXTENSION: u32 = 10;
const OP_MEMORY_MODEL: u32 = 14;
const OP_ENTRY_POINT: u32 = 15;
const OP_EXECUTION_MODE: u32 = 16;
const OP_CAPABILITY: u32 = 17;
const OP_TYPE_VOID: u32 = 19;
const OP_TYPE_BOOL: u32 = 20;
const OP_TYPE_INT: u32 = 21;
const OP_TYPE_FLOAT: u32 = 22;
const OP_TYPE_VECTOR: u32 = 23;
const OP_TYPE_RUNTIME_ARRAY: u32 = 29;
const OP_TYPE_STRUCT: u32 = 30;
const OP_TYPE_POINTER: u32 = 32;
const OP_TYPE_FUNCTION: u32 = 33;
const OP_CONSTANT_FALSE: u32 = 42;
const OP_CONSTANT: u32 = 43;
const OP_CONSTANT_COMPOSITE: u32 = 44;
const OP_FUNCTION: u32 = 54;
const OP_FUNCTION_END: u32 = 56;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_DECORATE: u32 = 71;
const OP_MEMBER_DECORATE: u32 = 72;
const OP_COMPOSITE_EXTRACT: u32 = 81;
const OP_IADD: u32 = 128;
const OP_FADD: u32 = 129;
const OP_ISUB: u32 = 130;
const OP_IMUL: u32 = 132;
const OP_UDIV: u32 = 134;
const OP_UMOD: u32 = 137;
const OP_SELECT: u32 = 169;
const OP_INOT_EQUAL: u32 = 171;
const OP_ULESS_THAN: u32 = 176;
const OP_BITWISE_AND: u32 = 199;
const OP_PHI: u32 = 245;
const OP_LOOP_MERGE: u32 = 246;
const OP_SELECTION_MERGE: u32 = 247;
const OP_LABEL: u32 = 248;
const OP_BRANCH: u32 = 249;
const OP_BRANCH_CONDITIONAL: u32 = 250;
const OP_RETURN: u32 = 253;
const OP_TYPE_COOPERATIVE_MATRIX: u32 = 4456;
const OP_COOPERATIVE_MATRIX_MUL_ADD: u32 = 4459;
const OP_LOAD_TENSOR: u32 = 5367;
const OP_STORE_TENSOR: u32 = 5368;
const OP_TYPE_TENSOR_LAYOUT: u32 = 5370;
const OP_TYPE_TENSOR_VIEW: u32 = 5371;
const OP_CREATE_TENSOR_LAYOUT: u32 = 5372;
const OP_TENSOR_LAYOUT_SET_DIMENSION: u32 = 5373;
const OP_TENSOR_LAYOUT_SET_STRIDE: u32 = 5374;
const OP_TENSOR_LAYOUT_SLICE: u32 = 5375;
const OP_CREATE_TENSOR_VIEW: u32 = 5377;

const CAP_SHADER: u32 = 1;
const CAP_FLOAT16: u32 = 9;
const CAP_STORAGE_BUFFER_16BIT: u32 = 4433;
const CAP_VULKAN_MEMORY_MODEL: u32 = 5345;
const CAP_COOPERATIVE_MATRIX_TENSOR_ADDRESSING: u32 = 5433;
const CAP_TENSOR_ADDRESSING: u32 = 5439;
const CAP_COOPERATIVE_MATRIX: u32 = 6022;

const STORAGE_INPUT: u32 = 1;
const STORAGE_UNIFORM: u32 = 2;
const STORAGE_STORAGE_BUFFER: u32 = 12;
const DECORATION_BLOCK: u32 = 2;
const DECORATION_ARRAY_STRIDE: u32 = 6;
const DECORATION_BUILTIN: u32 = 11;
const DECORATION_NON_WRITABLE: u32 = 24;
const DECORATION_BINDING: u32 = 33;
const DECORATION_DESCRIPTOR_SET: u32 = 34;
const DECORATION_OFFSET: u32 = 35;
const BUILTIN_WORKGROUP_ID: u32 = 26;
const SCOPE_WORKGROUP: u32 = 2;
const USE_A: u32 = 0;
const USE_B: u32 = 1;
const USE_ACCUMULATOR: u32 = 2;

/// The u32 fields of `MatmulParams` the kernel reads, by index (common/matmul_params.wgsl).
const P_N_COLS: u32 = 0;
const P_K: u32 = 1;
const P_N_ROWS: u32 = 2;
const P_ROW_OFFSET: u32 = 3;
const P_X_STRIDE: u32 = 4;
const P_Y_STRIDE: u32 = 5;
const P_ACCUMULATE: u32 = 7;
const PARAM_FIELDS: u32 = 12;

/// A module's words as they are written: one section per part of SPIR-V's logical layout,
/// and the next free id.
struct Module {
    head: Vec<u32>,
    decorations: Vec<u32>,
    globals: Vec<u32>,
    code: Vec<u32>,
    next: u32,
}

fn push(out: &mut Vec<u32>, op: u32, operands: &[u32]) {
    out.push(((operands.len() as u32 + 1) << 16) | op);
    out.extend_from_slice(operands);
}

/// A string operand: its bytes, nul-terminated, in little-endian words.
fn string(s: &str) -> Vec<u32> {
    let bytes: Vec<u8> = s.bytes().chain([0]).collect();
    bytes.chunks(4).map(|c| c.iter().enumerate().fold(0u32, |w, (j, b)| w | (*b as u32) << (8 * j))).collect()
}

impl Module {
    fn id(&mut self) -> u32 {
        self.next += 1;
        self.next - 1
    }
    /// A global declaration with a result id (types, constants, variables).
    fn global(&mut self, op: u32, before: &[u32], after: &[u32]) -> u32 {
        let id = self.id();
        let mut operands = before.to_vec();
        operands.push(id);
        operands.extend_from_slice(after);
        push(&mut self.globals, op, &operands);
        id
    }
    fn type_(&mut self, op: u32, operands: &[u32]) -> u32 {
        self.global(op, &[], operands)
    }
    fn constant(&mut self, ty: u32, v: u32) -> u32 {
        self.global(OP_CONSTANT, &[ty], &[v])
    }
    /// An instruction in the function with a result of type `ty`.
    fn op(&mut self, op: u32, ty: u32, operands: &[u32]) -> u32 {
        let id = self.id();
        let mut all = vec![ty, id];
        all.extend_from_slice(operands);
        push(&mut self.code, op, &all);
        id
    }
    /// An instruction in the function without a result.
    fn stmt(&mut self, op: u32, operands: &[u32]) {
        push(&mut self.code, op, operands);
    }
    fn label(&mut self, id: u32) {
        push(&mut self.code, OP_LABEL, &[id]);
    }
    fn decorate(&mut self, target: u32, operands: &[u32]) {
        let mut all = vec![target];
        all.extend_from_slice(operands);
        push(&mut self.decorations, OP_DECORATE, &all);
    }
    fn finish(self) -> Vec<u32> {
        let mut words = vec![0x0723_0203, 0x0001_0600, 0, self.next, 0];
        words.extend(self.head);
        words.extend(self.decorations);
        words.extend(self.globals);
        words.extend(self.code);
        words
    }
}

/// Where the kernel adds Y's tile to its sums when `accumulate` is set (the residual add). At
/// 4096^3 without it (accumulate 0) the three modules run within 0.2% (run 501).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddY {
    /// The sums start from Y's tile.
    Before,
    /// Y's tile is added after the K loop.
    After,
    /// Never: `accumulate` is ignored (`examples/coopmat2_lab.rs` only, to time the rest).
    Never,
}

/// The kernel's SPIR-V 1.6 module, entry point "main" (`BM` x `BN` x `BK` on `WG` invocations).
pub fn spirv() -> Vec<u32> {
    spirv_adding_y(AddY::After)
}

/// The module with Y's tile added where `add_y` says (the lab compares them).
pub fn spirv_adding_y(add_y: AddY) -> Vec<u32> {
    let mut m = Module { head: Vec::new(), decorations: Vec::new(), globals: Vec::new(), code: Vec::new(), next: 1 };
    let main = m.id();
    let wgid = m.id();
    let params = m.id();
    let (xv, wv, yv) = (m.id(), m.id(), m.id());
    for cap in [
        CAP_SHADER,
        CAP_FLOAT16,
        CAP_STORAGE_BUFFER_16BIT,
        CAP_VULKAN_MEMORY_MODEL,
        CAP_COOPERATIVE_MATRIX,
        CAP_TENSOR_ADDRESSING,
        CAP_COOPERATIVE_MATRIX_TENSOR_ADDRESSING,
    ] {
        push(&mut m.head, OP_CAPABILITY, &[cap]);
    }
    for ext in ["SPV_KHR_cooperative_matrix", "SPV_NV_cooperative_matrix2", "SPV_NV_tensor_addressing"] {
        push(&mut m.head, OP_EXTENSION, &string(ext));
    }
    push(&mut m.head, OP_MEMORY_MODEL, &[0, 3]); // Logical, Vulkan
    let mut entry = vec![5, main]; // GLCompute
    entry.extend(string("main"));
    entry.extend([wgid, params, xv, wv, yv]);
    push(&mut m.head, OP_ENTRY_POINT, &entry);
    push(&mut m.head, OP_EXECUTION_MODE, &[main, 17, WG, 1, 1]); // LocalSize

    // Types and constants.
    let void = m.type_(OP_TYPE_VOID, &[]);
    let fn_void = m.type_(OP_TYPE_FUNCTION, &[void]);
    let u32_t = m.type_(OP_TYPE_INT, &[32, 0]);
    let bool_t = m.type_(OP_TYPE_BOOL, &[]);
    let half = m.type_(OP_TYPE_FLOAT, &[16]);
    let f32_t = m.type_(OP_TYPE_FLOAT, &[32]);
    let v3u = m.type_(OP_TYPE_VECTOR, &[u32_t, 3]);
    let ptr_in_v3u = m.type_(OP_TYPE_POINTER, &[STORAGE_INPUT, v3u]);
    let params_t = m.type_(OP_TYPE_STRUCT, &[u32_t; PARAM_FIELDS as usize]);
    let ptr_u_params = m.type_(OP_TYPE_POINTER, &[STORAGE_UNIFORM, params_t]);
    let ptr_u_u32 = m.type_(OP_TYPE_POINTER, &[STORAGE_UNIFORM, u32_t]);
    // W and X: a block type each, read-only in the member and the variable, as glslang declares
    // `readonly buffer`s.
    let halves = m.type_(OP_TYPE_RUNTIME_ARRAY, &[half]);
    let w_block = m.type_(OP_TYPE_STRUCT, &[halves]);
    let ptr_sb_w = m.type_(OP_TYPE_POINTER, &[STORAGE_STORAGE_BUFFER, w_block]);
    let x_block = m.type_(OP_TYPE_STRUCT, &[halves]);
    let ptr_sb_x = m.type_(OP_TYPE_POINTER, &[STORAGE_STORAGE_BUFFER, x_block]);
    let ptr_sb_half = m.type_(OP_TYPE_POINTER, &[STORAGE_STORAGE_BUFFER, half]);
    let floats = m.type_(OP_TYPE_RUNTIME_ARRAY, &[f32_t]);
    let floats_block = m.type_(OP_TYPE_STRUCT, &[floats]);
    let ptr_sb_floats = m.type_(OP_TYPE_POINTER, &[STORAGE_STORAGE_BUFFER, floats_block]);
    let ptr_sb_f32 = m.type_(OP_TYPE_POINTER, &[STORAGE_STORAGE_BUFFER, f32_t]);
    let c = |m: &mut Module, v: u32| m.constant(u32_t, v);
    let (c0, c1, c2) = (c(&mut m, 0), c(&mut m, 1), c(&mut m, 2));
    let (cbm, cbn, cbk) = (c(&mut m, BM), c(&mut m, BN), c(&mut m, BK));
    let cgroup = c(&mut m, GROUP);
    let cstep = c(&mut m, BK * UNROLL);
    let calign = c(&mut m, !7u32);
    let scope = c(&mut m, SCOPE_WORKGROUP);
    let (use_a, use_b, use_c) = (c(&mut m, USE_A), c(&mut m, USE_B), c(&mut m, USE_ACCUMULATOR));
    let mat_a = m.type_(OP_TYPE_COOPERATIVE_MATRIX, &[half, scope, cbm, cbk, use_a]);
    let mat_b = m.type_(OP_TYPE_COOPERATIVE_MATRIX, &[half, scope, cbk, cbn, use_b]);
    let mat_c = m.type_(OP_TYPE_COOPERATIVE_MATRIX, &[f32_t, scope, cbm, cbn, use_c]);
    let f0 = m.global(OP_CONSTANT, &[f32_t], &[0]);
    let zero_c = m.global(OP_CONSTANT_COMPOSITE, &[mat_c], &[f0]);
    let undef_a = m.global(OP_UNDEF, &[mat_a], &[]);
    let undef_b = m.global(OP_UNDEF, &[mat_b], &[]);
    let cfalse = m.global(OP_CONSTANT_FALSE, &[bool_t], &[]);
    // 2-D layouts, clamp mode undefined (whole tiles only); the view reads W's K x N
    // transposed (dimensions 1, 0).
    let layout = m.type_(OP_TYPE_TENSOR_LAYOUT, &[c2, c0]);
    let view = m.type_(OP_TYPE_TENSOR_VIEW, &[c2, cfalse, c1, c0]);
    let offsets: Vec<u32> = (0..UNROLL).map(|u| c(&mut m, u * BK)).collect();

    // Interface: variables and their decorations.
    push(&mut m.globals, OP_VARIABLE, &[ptr_in_v3u, wgid, STORAGE_INPUT]);
    push(&mut m.globals, OP_VARIABLE, &[ptr_u_params, params, STORAGE_UNIFORM]);
    push(&mut m.globals, OP_VARIABLE, &[ptr_sb_w, wv, STORAGE_STORAGE_BUFFER]);
    push(&mut m.globals, OP_VARIABLE, &[ptr_sb_x, xv, STORAGE_STORAGE_BUFFER]);
    push(&mut m.globals, OP_VARIABLE, &[ptr_sb_floats, yv, STORAGE_STORAGE_BUFFER]);
    m.decorate(wgid, &[DECORATION_BUILTIN, BUILTIN_WORKGROUP_ID]);
    m.decorate(params_t, &[DECORATION_BLOCK]);
    for i in 0..PARAM_FIELDS {
        push(&mut m.decorations, OP_MEMBER_DECORATE, &[params_t, i, DECORATION_OFFSET, 4 * i]);
    }
    m.decorate(halves, &[DECORATION_ARRAY_STRIDE, 2]);
    m.decorate(floats, &[DECORATION_ARRAY_STRIDE, 4]);
    for block in [w_block, x_block, floats_block] {
        m.decorate(block, &[DECORATION_BLOCK]);
        push(&mut m.decorations, OP_MEMBER_DECORATE, &[block, 0, DECORATION_OFFSET, 0]);
    }
    for block in [w_block, x_block] {
        push(&mut m.decorations, OP_MEMBER_DECORATE, &[block, 0, DECORATION_NON_WRITABLE]);
    }
    for (var, binding) in [(params, 0), (wv, 1), (xv, 2), (yv, 3)] {
        m.decorate(var, &[DECORATION_DESCRIPTOR_SET, 0]);
        m.decorate(var, &[DECORATION_BINDING, binding]);
    }
    m.decorate(wv, &[DECORATION_NON_WRITABLE]);
    m.decorate(xv, &[DECORATION_NON_WRITABLE]);

    // The function.
    let (entry_l, then_l, merge_l, header_l, body_l, cont_l, exit_l) =
        (m.id(), m.id(), m.id(), m.id(), m.id(), m.id(), m.id());
    push(&mut m.code, OP_FUNCTION, &[void, main, 0, fn_void]);
    m.label(entry_l);
    let wg = m.op(OP_LOAD, v3u, &[wgid]);
    let wx = m.op(OP_COMPOSITE_EXTRACT, u32_t, &[wg, 0]);
    let wy = m.op(OP_COMPOSITE_EXTRACT, u32_t, &[wg, 1]);
    let param = |m: &mut Module, field: u32| {
        let idx = m.constant(u32_t, field);
        let p = m.op(OP_ACCESS_CHAIN, ptr_u_u32, &[params, idx]);
        m.op(OP_LOAD, u32_t, &[p])
    };
    let n_cols = param(&mut m, P_N_COLS);
    let k = param(&mut m, P_K);
    let n_rows = param(&mut m, P_N_ROWS);
    let row_offset = param(&mut m, P_ROW_OFFSET);
    let x_stride = param(&mut m, P_X_STRIDE);
    let y_stride = param(&mut m, P_Y_STRIDE);
    let accumulate = param(&mut m, P_ACCUMULATE);
    // The tile: t = wx + wy · tn in bands of g = min(GROUP, tm) rows of tiles, column by column
    // within a band (its last band may have fewer rows).
    let tn = m.op(OP_UDIV, u32_t, &[n_rows, cbn]);
    let tm = m.op(OP_UDIV, u32_t, &[n_cols, cbm]);
    let wy_tn = m.op(OP_IMUL, u32_t, &[wy, tn]);
    let t = m.op(OP_IADD, u32_t, &[wx, wy_tn]);
    let few = m.op(OP_ULESS_THAN, bool_t, &[cgroup, tm]);
    let g = m.op(OP_SELECT, u32_t, &[few, cgroup, tm]);
    let band_tiles = m.op(OP_IMUL, u32_t, &[g, tn]);
    let band = m.op(OP_UDIV, u32_t, &[t, band_tiles]);
    let band_row = m.op(OP_IMUL, u32_t, &[band, g]);
    let left = m.op(OP_ISUB, u32_t, &[tm, band_row]);
    let g_fits = m.op(OP_ULESS_THAN, bool_t, &[g, left]);
    let rows = m.op(OP_SELECT, u32_t, &[g_fits, g, left]);
    let band_first = m.op(OP_IMUL, u32_t, &[band, band_tiles]);
    let r = m.op(OP_ISUB, u32_t, &[t, band_first]);
    let r_row = m.op(OP_UMOD, u32_t, &[r, rows]);
    let tile_m = m.op(OP_IADD, u32_t, &[band_row, r_row]);
    let m0 = m.op(OP_IMUL, u32_t, &[tile_m, cbm]);
    let tile_n = m.op(OP_UDIV, u32_t, &[r, rows]);
    let n0 = m.op(OP_IMUL, u32_t, &[tile_n, cbn]);
    let y_col = m.op(OP_IADD, u32_t, &[row_offset, n0]);
    // Row strides known to be multiples of 8 halves (16 bytes), as the planner checked: the
    // driver's loads take 16 bytes at a time only where it can tell.
    let ka = m.op(OP_BITWISE_AND, u32_t, &[k, calign]);
    let xsa = m.op(OP_BITWISE_AND, u32_t, &[x_stride, calign]);
    let tensor = |m: &mut Module, rows: u32, cols: u32, stride: u32| {
        let l = m.op(OP_CREATE_TENSOR_LAYOUT, layout, &[]);
        let l = m.op(OP_TENSOR_LAYOUT_SET_DIMENSION, layout, &[l, rows, cols]);
        m.op(OP_TENSOR_LAYOUT_SET_STRIDE, layout, &[l, stride, c1])
    };
    let lx = tensor(&mut m, n_cols, xsa, xsa);
    let lw = tensor(&mut m, n_rows, ka, ka);
    let ly = tensor(&mut m, n_cols, y_stride, y_stride);
    let transposed = m.op(OP_CREATE_TENSOR_VIEW, view, &[]);
    let px = m.op(OP_ACCESS_CHAIN, ptr_sb_half, &[xv, c0, c0]);
    let pw = m.op(OP_ACCESS_CHAIN, ptr_sb_half, &[wv, c0, c0]);
    let py = m.op(OP_ACCESS_CHAIN, ptr_sb_f32, &[yv, c0, c0]);
    let y_tile = m.op(OP_TENSOR_LAYOUT_SLICE, layout, &[ly, m0, cbm, y_col, cbn]);
    let adds = m.op(OP_INOT_EQUAL, bool_t, &[accumulate, c0]);
    let iterations = m.op(OP_UDIV, u32_t, &[ka, cstep]);
    // AddY::Before: the sums start from Y's tile where the result is added to it.
    let start = if add_y == AddY::Before {
        m.stmt(OP_SELECTION_MERGE, &[merge_l, 0]);
        m.stmt(OP_BRANCH_CONDITIONAL, &[adds, then_l, merge_l]);
        m.label(then_l);
        let y_in = m.op(OP_LOAD_TENSOR, mat_c, &[py, zero_c, y_tile, 0, 0]);
        m.stmt(OP_BRANCH, &[merge_l]);
        m.label(merge_l);
        m.op(OP_PHI, mat_c, &[y_in, then_l, zero_c, entry_l])
    } else {
        m.stmt(OP_BRANCH, &[merge_l]);
        m.label(merge_l);
        zero_c
    };
    m.stmt(OP_BRANCH, &[header_l]);
    // for (i = 0; i < k / (BK · UNROLL); i++), k0 = i · BK · UNROLL: with the loop over k0
    // itself (k0 < k, k0 += BK · UNROLL) the driver's code took 611 µs at 4096^3 against 515
    // (glslang builds of both, run 500).
    m.label(header_l);
    let (i, k0, sums, i_next, k_next, sums_next) = (m.id(), m.id(), m.id(), m.id(), m.id(), m.id());
    push(&mut m.code, OP_PHI, &[u32_t, i, c0, merge_l, i_next, cont_l]);
    push(&mut m.code, OP_PHI, &[u32_t, k0, c0, merge_l, k_next, cont_l]);
    push(&mut m.code, OP_PHI, &[mat_c, sums, start, merge_l, sums_next, cont_l]);
    // Each load's Object (the matrix it loads into) is the one loaded before it, as glslang
    // writes a matrix variable loaded in a loop.
    let (a_prev, b_prev, a_last, b_last) = (m.id(), m.id(), m.id(), m.id());
    push(&mut m.code, OP_PHI, &[mat_a, a_prev, undef_a, merge_l, a_last, cont_l]);
    push(&mut m.code, OP_PHI, &[mat_b, b_prev, undef_b, merge_l, b_last, cont_l]);
    let more = m.op(OP_ULESS_THAN, bool_t, &[i, iterations]);
    m.stmt(OP_LOOP_MERGE, &[exit_l, cont_l, 0]);
    m.stmt(OP_BRANCH_CONDITIONAL, &[more, body_l, exit_l]);
    m.label(body_l);
    let (mut acc, mut a_obj, mut b_obj) = (sums, a_prev, b_prev);
    for (u, &off) in offsets.iter().enumerate() {
        let last = u + 1 == offsets.len();
        let ku = if u == 0 { k0 } else { m.op(OP_IADD, u32_t, &[k0, off]) };
        let a_tile = m.op(OP_TENSOR_LAYOUT_SLICE, layout, &[lx, m0, cbm, ku, cbk]);
        let a = if last { a_last } else { m.id() };
        push(&mut m.code, OP_LOAD_TENSOR, &[mat_a, a, px, a_obj, a_tile, 0, 0]);
        let b_tile = m.op(OP_TENSOR_LAYOUT_SLICE, layout, &[lw, n0, cbn, ku, cbk]);
        // Tensor addressing operands: TensorView.
        let b = if last { b_last } else { m.id() };
        push(&mut m.code, OP_LOAD_TENSOR, &[mat_b, b, pw, b_obj, b_tile, 0, 1, transposed]);
        let id = if last { sums_next } else { m.id() };
        push(&mut m.code, OP_COOPERATIVE_MATRIX_MUL_ADD, &[mat_c, id, a, b, acc]);
        (acc, a_obj, b_obj) = (id, a, b);
    }
    m.stmt(OP_BRANCH, &[cont_l]);
    m.label(cont_l);
    push(&mut m.code, OP_IADD, &[u32_t, k_next, k0, cstep]);
    push(&mut m.code, OP_IADD, &[u32_t, i_next, i, c1]);
    m.stmt(OP_BRANCH, &[header_l]);
    m.label(exit_l);
    // AddY::After: Y's tile added to the sums where the result is added to it.
    let out = if add_y == AddY::After {
        let (add_l, store_l) = (m.id(), m.id());
        m.stmt(OP_SELECTION_MERGE, &[store_l, 0]);
        m.stmt(OP_BRANCH_CONDITIONAL, &[adds, add_l, store_l]);
        m.label(add_l);
        let y_in = m.op(OP_LOAD_TENSOR, mat_c, &[py, zero_c, y_tile, 0, 0]);
        let with_y = m.op(OP_FADD, mat_c, &[sums, y_in]);
        m.stmt(OP_BRANCH, &[store_l]);
        m.label(store_l);
        m.op(OP_PHI, mat_c, &[with_y, add_l, sums, exit_l])
    } else {
        sums
    };
    m.stmt(OP_STORE_TENSOR, &[py, out, y_tile, 0, 0]);
    m.stmt(OP_RETURN, &[]);
    m.stmt(OP_FUNCTION_END, &[]);
    m.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the instruction stream: every instruction's word count lands on the next, the
    /// bound is above every id, and each result id is defined once.
    #[test]
    fn module_is_well_formed() {
        for add_y in [AddY::Before, AddY::After, AddY::Never] {
            well_formed(&spirv_adding_y(add_y), add_y);
        }
    }

    fn well_formed(words: &[u32], add_y: AddY) {
        assert_eq!(words[0], 0x0723_0203);
        let bound = words[3];
        let mut i = 5;
        let mut defined = std::collections::HashSet::new();
        let mut ops = Vec::new();
        while i < words.len() {
            let count = (words[i] >> 16) as usize;
            let op = words[i] & 0xffff;
            assert!(count >= 1 && i + count <= words.len(), "instruction {op} at word {i} overruns the module");
            ops.push(op);
            // The result id of instructions that have a result type (and of types/labels).
            let result = match op {
                OP_TYPE_VOID..=OP_TYPE_FUNCTION | OP_LABEL | OP_TYPE_TENSOR_LAYOUT | OP_TYPE_TENSOR_VIEW => {
                    Some(words[i + 1])
                }
                OP_TYPE_COOPERATIVE_MATRIX => Some(words[i + 1]),
                OP_UNDEF
                | OP_CONSTANT_FALSE
                | OP_CONSTANT
                | OP_CONSTANT_COMPOSITE
                | OP_VARIABLE
                | OP_LOAD
                | OP_ACCESS_CHAIN
                | OP_COMPOSITE_EXTRACT
                | OP_IADD
                | OP_FADD
                | OP_ISUB
                | OP_IMUL
                | OP_UDIV
                | OP_UMOD
                | OP_SELECT
                | OP_INOT_EQUAL
                | OP_ULESS_THAN
                | OP_BITWISE_AND
                | OP_PHI
                | OP_LOAD_TENSOR
                | OP_COOPERATIVE_MATRIX_MUL_ADD
                | OP_CREATE_TENSOR_LAYOUT
                | OP_TENSOR_LAYOUT_SET_DIMENSION
                | OP_TENSOR_LAYOUT_SET_STRIDE
                | OP_TENSOR_LAYOUT_SLICE
                | OP_CREATE_TENSOR_VIEW => Some(words[i + 2]),
                OP_FUNCTION => Some(words[i + 2]),
                _ => None,
            };
            if let Some(id) = result {
                assert!(id > 0 && id < bound, "id {id} of op {op} outside the bound {bound}");
                assert!(defined.insert(id), "id {id} defined twice");
            }
            i += count;
        }
        assert_eq!(i, words.len());
        let loads = ops.iter().filter(|&&o| o == OP_LOAD_TENSOR).count() as u32;
        let y_loads = if add_y == AddY::Never { 0 } else { 1 };
        assert_eq!(loads, 2 * UNROLL + y_loads, "A and B per unrolled step, and Y's tile");
        assert_eq!(ops.iter().filter(|&&o| o == OP_COOPERATIVE_MATRIX_MUL_ADD).count() as u32, UNROLL);
        assert_eq!(ops.last(), Some(&OP_FUNCTION_END));
    }
}

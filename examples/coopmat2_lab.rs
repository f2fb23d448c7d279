//! Workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2, NVIDIA's Vulkan driver),
//! for issue 12's GEMM. A WGSL GEMM is written with 16x16 matrices, translated by naga, and its
//! SPIR-V patched: the three matrix types get workgroup scope and the tile's sizes (A BMxBK, B
//! BKxBN, C BMxBN) and the module declares the extension. Or the module is kiln's own
//! (`LAB_MODE=kiln`: kernels/gemm_cm2.rs, `LAB_ADD_Y=before|after|never`), or one compiled
//! elsewhere with the lab's bindings (`LAB_SPV_IN=file.spv`, e.g. glslang's build of
//! profiling/cm2/gemm_tensor.comp). The device is opened through wgpu-hal with the extension
//! and its features enabled, and the module passed through (wgpu's PASSTHROUGH_SHADERS).
//!
//! `cargo run --release --example coopmat2_lab -- <M> <K> <N> <BM> <BN> <BK> <invocations>
//! [repetitions]` prints the best of 5 timestamped passes of that many dispatches, and the
//! worst relative error of 256 sampled outputs against an f64 CPU reference (F16 inputs, f32
//! outputs). `LAB_MODE` picks the kernel (below); `LAB_GROUP=g` visits the pipelined and tensor
//! kernels' tiles g rows of tiles at a time; `LAB_HINT=usage` opens the device with kiln's
//! memory hints (memory in small blocks); `LAB_SPV_OUT=dir` writes the WGSL and the patched
//! SPIR-V there; `LAB_SPV_ONLY=1` stops before opening a device (any machine).
//!
//! H200 (runs 485-490, 4096^3): the multiply-adds alone reach 570 TFLOP/s (mma.sync in CUDA:
//! 470); the driver's own staging from storage buffers 38-57; the pipelined kernel
//! (`pipe-pad2-ahead4`, 128x256x16 on 256 invocations) 646 us, 212.7 TFLOP/s. Tensor-addressed
//! loads (runs 493-501): 515-548 µs for glslang's build at 128x256x64, 45 TFLOP/s for the lab's
//! `tensor` mode (loads from the tile's first element), 521 µs for kiln's own module, which kiln
//! now runs (README, forty-eighth session).

use std::borrow::Cow;
use std::ffi::c_void;

use half::f16;
use wgpu::util::DeviceExt;

#[repr(C)]
struct Cm2Features {
    s_type: i32,
    p_next: *mut c_void,
    /// workgroup scope, flexible dimensions, reductions, conversions, per-element operations,
    /// tensor addressing, block loads.
    v: [u32; 7],
}

/// What every kernel declares: the parameters, W and X as arrays of `elem`, Y, the matrix
/// types (patched to the tile's sizes).
fn header(elem: &str) -> String {
    format!(
        "enable f16;
enable wgpu_cooperative_matrix;
struct P {{ m: u32, n: u32, k: u32, pad: u32 }}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<{elem}>;
@group(0) @binding(2) var<storage, read> xh: array<{elem}>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
alias TA = coop_mat16x16<f16, A>;
alias TB = coop_mat16x16<f16, B>;
alias TC = coop_mat16x16<f32, C>;
"
    )
}

/// The tile's sums into Y (naga needs the stride and the address as named values).
const STORE_Y: &str = "  let ns = p.n;\n  let yi = m0 * ns + n0;\n  let cv = c;\n  coopStoreT(cv, &y[yi], ns);\n";

/// `LAB_MODE`: `direct` (default) loads each K step's A and B from the storage buffers;
/// `compute` loads them once before the loop (the multiply-adds alone); `smem` stages one
/// A and one B tile in workgroup memory once and loads them from there every step.
/// `pipe...`: `pipe_wgsl`; `tensor...`: `tensor_wgsl`; `kiln`: kiln's module (`main`).
fn wgsl(k: u32, bm: u32, bn: u32, bk: u32, wg: u32) -> String {
    let mode = std::env::var("LAB_MODE").unwrap_or_else(|_| "direct".into());
    if mode.starts_with("tensor") {
        // tensor[-u<unroll>]: the direct kernel with its loads rewritten (tensor_loads)
        let unroll = mode.split("-u").nth(1).map(|t| t.parse().unwrap()).unwrap_or(1);
        return tensor_wgsl(bm, bn, bk, wg, unroll);
    }
    if mode.starts_with("pipe") {
        // pipe[-pad<vec4s>][-ahead<n>]
        let pad = mode.split("-pad").nth(1).map(|t| t.split('-').next().unwrap().parse().unwrap()).unwrap_or(0);
        let ahead = mode.split("-ahead").nth(1).map(|t| t.parse().unwrap()).unwrap_or(1);
        assert!(ahead == 1 || (ahead % 2 == 0 && (k / bk) % ahead == 0), "steps in whole groups of `ahead`");
        return pipe_wgsl(bm, bn, bk, wg, pad, ahead);
    }
    let (decl, pre, body) = match mode.as_str() {
        "compute" => (
            String::new(),
            "  let a = coopLoadT<TA>(&xh[m0 * ks], ks);\n  let b = coopLoad<TB>(&w[n0 * ks], ks);\n".to_string(),
            "    c = coopMultiplyAdd(a, b, c);\n".to_string(),
        ),
        "smem" => (
            format!("var<workgroup> sa: array<f16, {}>;\nvar<workgroup> sb: array<f16, {}>;\n", bm * bk, bn * bk),
            format!(
                "  for (var i = lid; i < {ta}u; i += {wg}u) {{ sa[i] = xh[(m0 + i / {bk}u) * ks + i % {bk}u]; }}
  for (var i = lid; i < {tb}u; i += {wg}u) {{ sb[i] = w[(n0 + i / {bk}u) * ks + i % {bk}u]; }}
  workgroupBarrier();\n",
                ta = bm * bk,
                tb = bn * bk
            ),
            format!(
                "    let a = coopLoadT<TA>(&sa[0], {bk}u);\n    let b = coopLoad<TB>(&sb[0], {bk}u);\n    c = coopMultiplyAdd(a, b, c);\n"
            ),
        ),
        _ => (
            String::new(),
            String::new(),
            "    let a = coopLoadT<TA>(&xh[m0 * ks + k], ks);\n    let b = coopLoad<TB>(&w[n0 * ks + k], ks);\n    c = coopMultiplyAdd(a, b, c);\n".to_string(),
        ),
    };
    header("f16")
        + &format!(
            "{decl}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let ks = p.k;
  let m0 = wid.y * {bm}u;
  let n0 = wid.x * {bn}u;
{pre}  var c = TC();
  for (var k = 0u; k < ks; k += {bk}u) {{
{body}  }}
{STORE_Y}}}
"
        )
}

/// `tensor[-u<n>]`: each K step's A and B loaded by the driver straight from the storage
/// buffers, as `direct`, but through tensor-addressed loads (`tensor_loads` rewrites the
/// SPIR-V): the form of llama.cpp's `mul_mm_cm2.comp`. The K loop unrolled `n` times (default
/// 1); `LAB_GROUP=g` visits the tiles g rows of tiles at a time.
fn tensor_wgsl(bm: u32, bn: u32, bk: u32, wg: u32, unroll: u32) -> String {
    let mut body = String::new();
    for u in 0..unroll {
        body += &format!(
            "    let a{u} = coopLoadT<TA>(&xh[m0 * ks + k + {o}u], ks);\n    let b{u} = coopLoad<TB>(&w[n0 * ks + k + {o}u], ks);\n    c = coopMultiplyAdd(a{u}, b{u}, c);\n",
            o = u * bk
        );
    }
    header("f16")
        + &format!(
            "@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>) {{
  let ks = p.k;
{order}  var c = TC();
  for (var k = 0u; k < ks; k += {step}u) {{
{body}  }}
{STORE_Y}}}
",
            step = bk * unroll,
            order = tile_order(bm, bn)
        )
}

/// m0 and n0 of the workgroup's tile: `LAB_GROUP=g` visits them g rows of tiles at a time,
/// column by column (L2 reuse); by default row by row.
fn tile_order(bm: u32, bn: u32) -> String {
    let group = std::env::var("LAB_GROUP").ok().and_then(|v| v.parse().ok()).unwrap_or(1u32 << 20);
    format!(
        "  let tn = p.n / {bn}u;
  let tm = p.m / {bm}u;
  let t = wid.x + wid.y * tn;
  let g = min({group}u, tm);
  let band = t / (g * tn);
  let rows = min(g, tm - band * g);
  let r = t - band * g * tn;
  let m0 = (band * g + r % rows) * {bm}u;
  let n0 = (r / rows) * {bn}u;
"
    )
}

/// `pipe[-pad<p>][-ahead<a>]`: a whole GEMM. Each K step's A and B tiles go from the storage
/// buffers (16-byte chunks, `a` steps ahead in registers, default 1) into one of two buffers in
/// workgroup memory, the workgroup-scope matrices load from the other; one barrier a step.
/// Rows are padded by `p` vec4s of halves (default 0).
fn pipe_wgsl(bm: u32, bn: u32, bk: u32, wg: u32, pad: u32, ahead: u32) -> String {
    let ldv = bk / 4 + pad; // row stride in vec4<f16>
    let cpr = bk / 8; // 16-byte chunks a row
    let na = bm * cpr / wg; // A chunks an invocation
    let nb = bn * cpr / wg;
    assert!(na >= 1 && nb >= 1 && bm * cpr % wg == 0 && bn * cpr % wg == 0);
    let mut s = header("vec4<u32>");
    s += &format!(
        "var<workgroup> xs: array<vec4<f16>, {xsz}>;
var<workgroup> ws: array<vec4<f16>, {wsz}>;
fn h4(a: u32, b: u32) -> vec4<f16> {{ return vec4<f16>(vec4<f32>(unpack2x16float(a), unpack2x16float(b))); }}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let ks = p.k;
  let kc = ks / 8u;
{order}  let steps = ks / {bk}u;
",
        xsz = 2 * bm * ldv,
        wsz = 2 * bn * ldv,
        order = tile_order(bm, bn)
    );
    for i in 0..na {
        s += &format!(
            "  let qa{i} = lid + {o}u;\n  let ga{i} = (m0 + qa{i} / {cpr}u) * kc + qa{i} % {cpr}u;\n  let sa{i} = (qa{i} / {cpr}u) * {ldv}u + (qa{i} % {cpr}u) * 2u;\n",
            o = i * wg
        );
    }
    for i in 0..nb {
        s += &format!(
            "  let qb{i} = lid + {o}u;\n  let gb{i} = (n0 + qb{i} / {cpr}u) * kc + qb{i} % {cpr}u;\n  let sb{i} = (qb{i} / {cpr}u) * {ldv}u + (qb{i} % {cpr}u) * 2u;\n",
            o = i * wg
        );
    }
    // Register set `r` loads step `step` (an expression); stores into buffer `buf`.
    let load = |s: &mut String, r: u32, step: &str| {
        *s += &format!("    {{ let ko = ({step}) * {cpr}u;\n");
        for i in 0..na {
            *s += &format!("    r{r}a{i} = xh[ga{i} + ko];\n");
        }
        for i in 0..nb {
            *s += &format!("    r{r}b{i} = w[gb{i} + ko];\n");
        }
        *s += "    }\n";
    };
    let store = |s: &mut String, r: u32, buf: &str| {
        for i in 0..na {
            *s += &format!(
                "    xs[{buf} * {t}u + sa{i}] = h4(r{r}a{i}.x, r{r}a{i}.y);\n    xs[{buf} * {t}u + sa{i} + 1u] = h4(r{r}a{i}.z, r{r}a{i}.w);\n",
                t = bm * ldv
            );
        }
        for i in 0..nb {
            *s += &format!(
                "    ws[{buf} * {t}u + sb{i}] = h4(r{r}b{i}.x, r{r}b{i}.y);\n    ws[{buf} * {t}u + sb{i} + 1u] = h4(r{r}b{i}.z, r{r}b{i}.w);\n",
                t = bn * ldv
            );
        }
    };
    let mma = |s: &mut String, buf: &str| {
        *s += &format!(
            "    {{ let a = coopLoadT<TA>(&xs[{buf} * {}u], {ldv}u);\n    let b = coopLoad<TB>(&ws[{buf} * {}u], {ldv}u);\n    c = coopMultiplyAdd(a, b, c); }}\n",
            bm * ldv,
            bn * ldv
        );
    };
    for r in 0..ahead {
        for i in 0..na {
            s += &format!("  var r{r}a{i}: vec4<u32>;\n");
        }
        for i in 0..nb {
            s += &format!("  var r{r}b{i}: vec4<u32>;\n");
        }
    }
    load(&mut s, 0, "0u");
    store(&mut s, 0, "0u");
    if ahead == 1 {
        s += "  workgroupBarrier();\n  var c = TC();\n";
        s += "  for (var st = 0u; st < steps; st++) {\n    let cur = st % 2u;\n    let more = st + 1u < steps;\n";
        s += "    if (more) {\n";
        load(&mut s, 0, "st + 1u");
        s += "    }\n";
        mma(&mut s, "cur");
        s += "    if (more) {\n";
        store(&mut s, 0, "(1u - cur)");
        s += "    }\n    workgroupBarrier();\n  }\n";
    } else {
        // `ahead` register sets, the loop unrolled by `ahead` (an even number dividing the
        // steps) so each part names its own: part t loads step t + ahead into set t % ahead
        // (stored at t - 1), multiplies buffer t % 2, stores set (t + 1) % ahead into the other.
        for j in 1..ahead {
            s += &format!("  if ({j}u < steps) {{\n");
            load(&mut s, j, &format!("{j}u"));
            s += "  }\n";
        }
        s += "  workgroupBarrier();\n  var c = TC();\n";
        s += &format!("  for (var st = 0u; st < steps; st += {ahead}u) {{\n");
        for t in 0..ahead {
            s += &format!("    if (st + {}u < steps) {{\n", t + ahead);
            load(&mut s, t, &format!("st + {}u", t + ahead));
            s += "    }\n";
            mma(&mut s, &format!("{}u", t % 2));
            s += &format!("    if (st + {}u < steps) {{\n", t + 1);
            store(&mut s, (t + 1) % ahead, &format!("{}u", (t + 1) % 2));
            s += "    }\n    workgroupBarrier();\n";
        }
        s += "  }\n";
    }
    s += STORE_Y;
    s += "}\n";
    s
}

/// The kernel as SPIR-V 1.6, translated as wgpu translates kiln's trusted modules
/// (`Dump::spirv`: no bounds checks, workgroup memory not zeroed).
fn spirv(src: &str) -> Vec<u32> {
    if let Ok(dir) = std::env::var("LAB_SPV_OUT") {
        std::fs::write(format!("{dir}/lab.wgsl"), src).unwrap();
    }
    let dump = kiln::gpu::dump::Dump {
        label: "cm2 gemm".into(),
        entry: "main".into(),
        bindings: Vec::new(),
        overrides: Vec::new(),
        text: src.into(),
    };
    dump.spirv().unwrap_or_else(|e| panic!("{e}")).0
}

/// The matrix types at workgroup scope with the tile's sizes; the extension declared. Returns
/// the ids of the constants BM, BN and BK.
fn patch(words: &mut Vec<u32>, bm: u32, bn: u32, bk: u32) -> (u32, u32, u32) {
    const OP_EXTENSION: u32 = 10;
    const OP_TYPE_INT: u32 = 21;
    const OP_CONSTANT: u32 = 43;
    const OP_TYPE_COOP_KHR: u32 = 4456;
    let mut constants = std::collections::HashMap::new();
    let mut uint = None;
    let mut first_ext = None;
    let mut coop = Vec::new();
    let mut i = 5;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        let op = words[i] & 0xffff;
        match op {
            OP_EXTENSION if first_ext.is_none() => first_ext = Some(i),
            OP_TYPE_INT if words[i + 2] == 32 && words[i + 3] == 0 && uint.is_none() => {
                uint = Some((words[i + 1], i + count))
            }
            OP_CONSTANT if count == 4 => {
                constants.insert(words[i + 2], words[i + 3]);
            }
            OP_TYPE_COOP_KHR => coop.push(i),
            _ => {}
        }
        i += count.max(1);
    }
    let (uint, after_uint) = uint.expect("no u32 type");
    let id = words[3];
    words[3] += 4;
    let (scope, cm, cn, ck) = (id, id + 1, id + 2, id + 3);
    for &t in &coop {
        // OpTypeCooperativeMatrixKHR result, component type, scope, rows, columns, use
        let role = constants[&words[t + 6]];
        words[t + 3] = scope;
        let (r, c) = match role {
            0 => (cm, ck),
            1 => (ck, cn),
            _ => (cm, cn),
        };
        words[t + 4] = r;
        words[t + 5] = c;
    }
    let mut new = Vec::new();
    for (cid, v) in [(scope, 2u32), (cm, bm), (cn, bn), (ck, bk)] {
        new.extend([(4 << 16) | OP_CONSTANT, uint, cid, v]);
    }
    words.splice(after_uint..after_uint, new);
    let name = b"SPV_NV_cooperative_matrix2\0";
    let mut ext = vec![0u32; name.len().div_ceil(4)];
    for (j, b) in name.iter().enumerate() {
        ext[j / 4] |= (*b as u32) << (8 * (j % 4));
    }
    let mut inst = vec![((ext.len() as u32 + 1) << 16) | OP_EXTENSION];
    inst.extend(ext);
    let at = first_ext.expect("no OpExtension");
    words.splice(at..at, inst);
    assert!(coop.len() >= 3, "{} matrix types", coop.len());
    (cm, cn, ck)
}

/// A string operand: its bytes, nul-terminated, in little-endian words.
fn string_words(name: &str) -> Vec<u32> {
    let bytes: Vec<u8> = name.bytes().chain([0]).collect();
    let mut out = vec![0u32; bytes.len().div_ceil(4)];
    for (j, b) in bytes.iter().enumerate() {
        out[j / 4] |= (*b as u32) << (8 * (j % 4));
    }
    out
}

/// Every `OpCooperativeMatrixLoadKHR` of an A (row-major, BM x BK) or B (column-major,
/// BK x BN) matrix from a storage buffer becomes an `OpCooperativeMatrixLoadTensorNV` from the
/// same address: a 2-D tensor layout of the tile's rows x K (A: BM x BK; B: BN x BK, read
/// through a transposing tensor view) with the load's stride, as llama.cpp's
/// `mul_mm_cm2.comp` slices its layouts. `cm`, `cn`, `ck`: the ids of BM, BN, BK.
fn tensor_loads(words: &mut Vec<u32>, cm: u32, cn: u32, ck: u32) {
    const OP_CAPABILITY: u32 = 17;
    const OP_EXTENSION: u32 = 10;
    const OP_TYPE_BOOL: u32 = 20;
    const OP_TYPE_INT: u32 = 21;
    const OP_CONSTANT_FALSE: u32 = 42;
    const OP_CONSTANT: u32 = 43;
    const OP_UNDEF: u32 = 1;
    const OP_FUNCTION: u32 = 54;
    const OP_TYPE_COOP_KHR: u32 = 4456;
    const OP_LOAD_KHR: u32 = 4457;
    const OP_LOAD_TENSOR: u32 = 5367;
    const OP_TYPE_TENSOR_LAYOUT: u32 = 5370;
    const OP_TYPE_TENSOR_VIEW: u32 = 5371;
    const OP_CREATE_LAYOUT: u32 = 5372;
    const OP_LAYOUT_DIMENSION: u32 = 5373;
    const OP_LAYOUT_STRIDE: u32 = 5374;
    const OP_CREATE_VIEW: u32 = 5377;
    const CAP_COOP_TENSOR_ADDRESSING: u32 = 5433;
    const CAP_TENSOR_ADDRESSING: u32 = 5439;
    let mut bool_type = None;
    let mut uint = None;
    let mut constants = std::collections::HashMap::new();
    let mut first_function = None;
    let mut first_ext = None;
    let mut loads = Vec::new();
    let mut coop_use = std::collections::HashMap::new();
    let mut i = 5;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        match words[i] & 0xffff {
            OP_EXTENSION if first_ext.is_none() => first_ext = Some(i),
            OP_TYPE_BOOL => bool_type = Some(words[i + 1]),
            OP_TYPE_INT if words[i + 2] == 32 && words[i + 3] == 0 && uint.is_none() => uint = Some(words[i + 1]),
            OP_CONSTANT if count == 4 => {
                constants.insert(words[i + 2], words[i + 3]);
            }
            OP_TYPE_COOP_KHR => {
                coop_use.insert(words[i + 1], words[i + 6]);
            }
            OP_FUNCTION if first_function.is_none() => first_function = Some(i),
            OP_LOAD_KHR => loads.push(i),
            _ => {}
        }
        i += count.max(1);
    }
    let uint = uint.expect("no u32 type");
    let mut next = words[3];
    let mut id = || {
        next += 1;
        next - 1
    };
    let (c0, c1, c2, cfalse, layout_t, view_t) = (id(), id(), id(), id(), id(), id());
    let mut globals = Vec::new();
    let bool_t = bool_type.unwrap_or_else(|| {
        let b = id();
        globals.extend([(2 << 16) | OP_TYPE_BOOL, b]);
        b
    });
    for (cid, v) in [(c0, 0u32), (c1, 1), (c2, 2)] {
        globals.extend([(4 << 16) | OP_CONSTANT, uint, cid, v]);
    }
    globals.extend([(3 << 16) | OP_CONSTANT_FALSE, bool_t, cfalse]);
    // 2-D layouts, clamp mode undefined (whole tiles only); the view swaps the dimensions.
    globals.extend([(4 << 16) | OP_TYPE_TENSOR_LAYOUT, layout_t, c2, c0]);
    globals.extend([(6 << 16) | OP_TYPE_TENSOR_VIEW, view_t, c2, cfalse, c1, c0]);
    // Loads from the end backwards, so that earlier offsets stay valid.
    // Ordered, so that the module comes out the same every time.
    let mut undefs = std::collections::BTreeMap::new();
    for &at in loads.iter().rev() {
        // OpCooperativeMatrixLoadKHR result_type result pointer layout stride [memory operand]
        let (ty, res, ptr, stride) = (words[at + 1], words[at + 2], words[at + 3], words[at + 5]);
        let count = (words[at] >> 16) as usize;
        let role = constants[&coop_use[&ty]];
        let undef = *undefs.entry(ty).or_insert_with(&mut id);
        let (l0, l1, l2) = (id(), id(), id());
        let rows = if role == 0 { cm } else { cn };
        let mut seq = vec![
            (3 << 16) | OP_CREATE_LAYOUT,
            layout_t,
            l0,
            (6 << 16) | OP_LAYOUT_DIMENSION,
            layout_t,
            l1,
            l0,
            rows,
            ck,
            (6 << 16) | OP_LAYOUT_STRIDE,
            layout_t,
            l2,
            l1,
            stride,
            c1,
        ];
        match role {
            0 => seq.extend([(8 << 16) | OP_LOAD_TENSOR, ty, res, ptr, undef, l2, 0, 0]),
            1 => {
                let v = id();
                seq.extend([(3 << 16) | OP_CREATE_VIEW, view_t, v]);
                seq.extend([(9 << 16) | OP_LOAD_TENSOR, ty, res, ptr, undef, l2, 0, 1, v]);
            }
            r => panic!("a load of an accumulator (use {r}) is not rewritten"),
        }
        words.splice(at..at + count, seq);
    }
    for (ty, u) in undefs {
        globals.extend([(3 << 16) | OP_UNDEF, ty, u]);
    }
    let at = first_function.expect("no function");
    words.splice(at..at, globals);
    let mut head = Vec::new();
    for cap in [CAP_TENSOR_ADDRESSING, CAP_COOP_TENSOR_ADDRESSING] {
        head.extend([(2 << 16) | OP_CAPABILITY, cap]);
    }
    let ext = string_words("SPV_NV_tensor_addressing");
    head.push(((ext.len() as u32 + 1) << 16) | OP_EXTENSION);
    head.extend(ext);
    let at = first_ext.expect("no OpExtension");
    words.splice(at..at, head);
    words[3] = next;
}

fn main() {
    let a: Vec<u32> = std::env::args().skip(1).map(|s| s.parse().expect("numbers")).collect();
    let (m, k, n, bm, bn, bk, wg) = (a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
    let reps = a.get(7).copied().unwrap_or(20);
    assert!(m % bm == 0 && n % bn == 0 && k % bk == 0, "whole tiles only");

    let kiln_kernel = std::env::var("LAB_MODE").is_ok_and(|m| m == "kiln");
    let mut words = match std::env::var("LAB_SPV_IN") {
        // A module compiled elsewhere (e.g. GLSL through glslang) with the same bindings.
        Ok(path) => bytemuck::pod_collect_to_vec(&std::fs::read(path).expect("LAB_SPV_IN")),
        // kiln's own workgroup-scope GEMM (kernels::gemm_cm2), its tile fixed.
        Err(_) if kiln_kernel => {
            use kiln::kernels::gemm_cm2 as g;
            assert_eq!((bm, bn, bk, wg), (g::BM, g::BN, g::BK, g::WG), "kiln's tile");
            // LAB_ADD_Y=before|after|never: where it adds Y's tile (`gemm_cm2::AddY`).
            let add_y = match std::env::var("LAB_ADD_Y").as_deref() {
                Ok("before") => g::AddY::Before,
                Ok("never") => g::AddY::Never,
                _ => g::AddY::After,
            };
            g::spirv_adding_y(add_y)
        }
        Err(_) => spirv(&wgsl(k, bm, bn, bk, wg)),
    };
    if std::env::var("LAB_SPV_IN").is_err() && !kiln_kernel {
        let (cm, cn, ck) = patch(&mut words, bm, bn, bk);
        if std::env::var("LAB_MODE").is_ok_and(|m| m.starts_with("tensor")) {
            tensor_loads(&mut words, cm, cn, ck);
        }
    }
    if let Ok(dir) = std::env::var("LAB_SPV_OUT") {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(format!("{dir}/gemm_{bm}x{bn}x{bk}_{wg}.spv"), bytes).unwrap();
    }
    if std::env::var("LAB_SPV_ONLY").is_ok() {
        return;
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    desc.flags = wgpu::InstanceFlags::empty();
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .expect("adapter");
    let features = adapter.features()
        & (wgpu::Features::SHADER_F16
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::PASSTHROUGH_SHADERS);
    let limits = adapter.limits();
    let mut cm2 = Cm2Features { s_type: 1000593000, p_next: std::ptr::null_mut(), v: [1; 7] };
    let cm2_ptr = &mut cm2 as *mut Cm2Features as *const c_void;
    // LAB_HINT=usage: memory in small blocks, as kiln opens its device.
    let hints = if std::env::var("LAB_HINT").is_ok_and(|h| h == "usage") {
        wgpu::MemoryHints::MemoryUsage
    } else {
        wgpu::MemoryHints::Performance
    };
    let open = {
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }.expect("a Vulkan adapter");
        let cb = move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs| {
            args.extensions.push(c"VK_NV_cooperative_matrix2");
            args.create_info.p_next = cm2_ptr;
        };
        unsafe { hal.open_with_callback(features, &limits, &hints, Some(Box::new(cb))) }
            .expect("device with VK_NV_cooperative_matrix2")
    };
    let (device, queue) = unsafe {
        adapter.create_device_from_hal::<wgpu::hal::api::Vulkan>(
            open,
            &wgpu::DeviceDescriptor {
                label: Some("lab"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::enabled(),
                memory_hints: hints.clone(),
                trace: wgpu::Trace::Off,
            },
        )
    }
    .expect("wgpu device");
    let _ = &cm2;

    let module = unsafe {
        device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
            label: Some("cm2 gemm"),
            entry_points: Cow::Owned(vec![wgpu::PassthroughShaderEntryPoint {
                name: "main".into(),
                workgroup_size: (wg, 1, 1),
            }]),
            spirv: Some(Cow::Borrowed(&words)),
            ..Default::default()
        })
    };
    let entry =
        |binding, ty| wgpu::BindGroupLayoutEntry { binding, visibility: wgpu::ShaderStages::COMPUTE, ty, count: None };
    let storage = |read_only| wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Storage { read_only },
        has_dynamic_offset: false,
        min_binding_size: None,
    };
    let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &[
            entry(
                0,
                wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
            ),
            entry(1, storage(true)),
            entry(2, storage(true)),
            entry(3, storage(false)),
        ],
    });
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("cm2 gemm"),
        layout: Some(&pl),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });

    // Inputs: small pseudo-random values, exactly representable in f16.
    let mut seed = 12345u64;
    let mut rnd = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as i32 % 17 - 8) as f32 / 16.0
    };
    let xs: Vec<f16> = (0..(m * k) as usize).map(|_| f16::from_f32(rnd())).collect();
    let ws: Vec<f16> = (0..(n * k) as usize).map(|_| f16::from_f32(rnd())).collect();
    let pb = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        // kiln's matmul parameters (n_cols, k, n_rows, row_offset, x_stride, y_stride, ...)
        // for its kernel, the lab's (m, n, k) for the others.
        contents: bytemuck::cast_slice(&if kiln_kernel {
            [m, k, n, 0, k, n, 0, 0, 0, 1, 0, 0]
        } else {
            [m, n, k, 0, 0, 0, 0, 0, 0, 0, 0, 0u32]
        }),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let wb = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&ws),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let xb = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&xs),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let ybytes = (m * n * 4) as u64;
    let yb = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: ybytes,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let rb = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: ybytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &bgl,
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: pb.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: wb.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 2, resource: xb.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 3, resource: yb.as_entire_binding() },
        ],
    });
    let qs =
        device.create_query_set(&wgpu::QuerySetDescriptor { label: None, ty: wgpu::QueryType::Timestamp, count: 2 });
    let qb = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let qr = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let run = |times: u32, timed: bool| {
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let tw = timed.then_some(wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: tw });
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bg, &[]);
            for _ in 0..times {
                pass.dispatch_workgroups(n / bn, m / bm, 1);
            }
        }
        if timed {
            enc.resolve_query_set(&qs, 0..2, &qb, 0);
            enc.copy_buffer_to_buffer(&qb, 0, &qr, 0, 16);
        }
        queue.submit([enc.finish()]);
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    };
    run(2, false);
    let period = queue.get_timestamp_period() as f64;
    let mut best = f64::MAX;
    for _ in 0..5 {
        run(reps, true);
        qr.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let t: Vec<u64> = bytemuck::cast_slice(&qr.slice(..).get_mapped_range().unwrap()).to_vec();
        qr.unmap();
        best = best.min((t[1] - t[0]) as f64 * period / 1e3 / reps as f64);
    }
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(&yb, 0, &rb, 0, ybytes);
    queue.submit([enc.finish()]);
    rb.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let y: Vec<f32> = bytemuck::cast_slice(&rb.slice(..).get_mapped_range().unwrap()).to_vec();
    let mut worst = 0f64;
    let mut s = 7u64;
    for _ in 0..256 {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        let (r, c) = ((s >> 33) % m as u64, (s >> 13) % n as u64);
        let want: f64 = (0..k as u64)
            .map(|j| xs[(r * k as u64 + j) as usize].to_f64() * ws[(c * k as u64 + j) as usize].to_f64())
            .sum();
        let got = y[(r * n as u64 + c) as usize] as f64;
        worst = worst.max((got - want).abs() / want.abs().max(1.0));
    }
    println!(
        "cm2 {} {m}x{k}x{n} tile {bm}x{bn}x{bk} wg {wg}: {best:.1} µs, {:.1} TFLOP/s, worst error {worst:.2e}",
        std::env::var("LAB_SPV_IN").or_else(|_| std::env::var("LAB_MODE")).unwrap_or_else(|_| "direct".into()),
        flops / best / 1e6
    );
}

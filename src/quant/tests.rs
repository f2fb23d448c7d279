use super::dequant::get_scale_min_k4;
use super::quantize::{pack_scale_min_k4, SplitMix64};
use super::*;
use std::path::PathBuf;

/// `$KILN_TESTDATA/qvectors`, defaulting to the shared test data next to the crate.
fn qvectors_dir() -> PathBuf {
    let root = std::env::var_os("KILN_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata"));
    root.join("qvectors")
}

fn read_bytes(name: &str) -> Vec<u8> {
    let path = qvectors_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_f32s(name: &str) -> Vec<f32> {
    let bytes = read_bytes(name);
    assert_eq!(bytes.len() % 4, 0, "{name} is not whole f32s");
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

const QVECTOR_TYPES: [(&str, WeightFormat); 6] = [
    ("q8_0", WeightFormat::Q8_0),
    ("q4_K", WeightFormat::Q4K),
    ("q5_K", WeightFormat::Q5K),
    ("q6_K", WeightFormat::Q6K),
    ("f16", WeightFormat::F16),
    ("bf16", WeightFormat::BF16),
];
const QV_ROWS: usize = 16;
const QV_COLS: usize = 256;

fn first_bit_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits())
}

#[test]
fn qvectors_dequantize_bit_exact() {
    for (file_stem, format) in QVECTOR_TYPES {
        let blocks = read_bytes(&format!("{file_stem}.blocks.bin"));
        let want = read_f32s(&format!("{file_stem}.dequant.f32"));
        assert_eq!(want.len(), QV_ROWS * QV_COLS);
        assert_eq!(Some(blocks.len()), format.tensor_bytes(QV_ROWS, QV_COLS), "{file_stem}");

        let mut got = vec![f32::NAN; want.len()];
        dequantize(format, &blocks, want.len(), &mut got).expect("whole tensor");
        if let Some(i) = first_bit_difference(&got, &want) {
            panic!(
                "{file_stem}: first difference at index {i} (row {}, col {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
                i / QV_COLS,
                i % QV_COLS,
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            );
        }

        // Row by row must agree with the whole-tensor decode.
        let row_bytes = format.row_bytes(QV_COLS).expect("256 is whole blocks");
        let mut row = vec![0.0f32; QV_COLS];
        for (r, bytes) in blocks.chunks_exact(row_bytes).enumerate() {
            dequantize_row(format, bytes, &mut row).expect("one row");
            let want_row = &want[r * QV_COLS..(r + 1) * QV_COLS];
            assert_eq!(first_bit_difference(&row, want_row), None, "{file_stem} row {r}");
        }
    }
}

#[test]
fn quantize_matches_ggml_for_exact_rounding_formats() {
    // F16/BF16 are plain round-to-nearest-even and Q8_0 follows ggml's reference
    // quantizer, so our encodings must equal ggml's bytes.
    let input = read_f32s("input.f32");
    for (file_stem, format) in [("f16", WeightFormat::F16), ("bf16", WeightFormat::BF16), ("q8_0", WeightFormat::Q8_0)]
    {
        let want = read_bytes(&format!("{file_stem}.blocks.bin"));
        let got = quantize(format, &input).expect("whole blocks");
        let first = got.iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(got.len(), want.len(), "{file_stem}");
        assert_eq!(first, None, "{file_stem}: first differing byte");
    }
}

fn relative_rms_error(format: WeightFormat, values: &[f32]) -> f64 {
    let blocks = quantize(format, values).expect("whole blocks");
    assert_eq!(Some(blocks.len()), format.row_bytes(values.len()));
    let mut decoded = vec![0.0f32; values.len()];
    dequantize(format, &blocks, values.len(), &mut decoded).expect("own blocks decode");
    let err: f64 = values.iter().zip(&decoded).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let norm: f64 = values.iter().map(|x| (*x as f64).powi(2)).sum();
    (err / norm).sqrt()
}

#[test]
fn quantize_round_trip_error() {
    let mut rng = SplitMix64(42);
    let values: Vec<f32> = (0..256 * 64).map(|_| rng.next_normal()).collect();
    let bounds = [
        (WeightFormat::F32, 0.0),
        (WeightFormat::F16, 1e-3),
        (WeightFormat::BF16, 5e-3),
        (WeightFormat::Q8_0, 0.01),
        (WeightFormat::Q6K, 0.06),
        (WeightFormat::Q5K, 0.06),
        (WeightFormat::Q4K, 0.12),
    ];
    for (format, bound) in bounds {
        let rel = relative_rms_error(format, &values);
        println!("{format}: relative RMS error {rel:.5} (bound {bound})");
        assert!(rel <= bound, "{format}: relative RMS error {rel} above {bound}");
    }
}

#[test]
fn quantize_handles_degenerate_blocks() {
    // Zeros, constants and all-negative blocks must stay finite and close.
    for format in WeightFormat::ALL {
        for values in [vec![0.0f32; 256], vec![0.5f32; 256], vec![-0.25f32; 256]] {
            let blocks = quantize(format, &values).expect("whole blocks");
            let mut decoded = vec![f32::NAN; 256];
            dequantize(format, &blocks, 256, &mut decoded).expect("decode");
            for (x, y) in values.iter().zip(&decoded) {
                assert!((x - y).abs() <= 0.02, "{format}: {x} decoded as {y}");
            }
        }
    }
}

#[test]
fn random_blocks_are_valid_and_deterministic() {
    for format in WeightFormat::ALL {
        let blocks = random_blocks(format, 512, 7).expect("whole blocks");
        assert_eq!(Some(blocks.len()), format.row_bytes(512));
        assert_eq!(blocks, random_blocks(format, 512, 7).expect("whole blocks"));
        let mut decoded = vec![0.0f32; 512];
        dequantize(format, &blocks, 512, &mut decoded).expect("decode");
        let rms = (decoded.iter().map(|v| v * v).sum::<f32>() / 512.0).sqrt();
        assert!((0.01..0.03).contains(&rms), "{format}: rms {rms}");
    }
    assert!(random_blocks(WeightFormat::Q4K, 100, 1).is_err());
}

#[test]
fn scale_min_packing_round_trips() {
    let mut rng = SplitMix64(3);
    for _ in 0..200 {
        let scales: [u8; 8] = std::array::from_fn(|_| (rng.next_normal().to_bits() % 64) as u8);
        let mins: [u8; 8] = std::array::from_fn(|_| (rng.next_normal().to_bits() % 64) as u8);
        let packed = pack_scale_min_k4(&scales, &mins);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (scales[j], mins[j]));
        }
    }
}

#[test]
fn repack_q8_0_moves_d_after_qs() {
    let blocks = read_bytes("q8_0.blocks.bin");
    let gpu = repack_for_gpu(WeightFormat::Q8_0, &blocks).expect("whole blocks");
    assert_eq!(Some(gpu.len()), WeightFormat::Q8_0.gpu_tensor_bytes(QV_ROWS, QV_COLS));
    for (src, dst) in blocks.chunks_exact(34).zip(gpu.chunks_exact(36)) {
        assert_eq!(&dst[..32], &src[2..34], "qs");
        assert_eq!(&dst[32..34], &src[..2], "d");
        assert_eq!(&dst[34..], &[0, 0]);
    }
}

#[test]
fn repack_q6_k_pads_and_others_copy() {
    let blocks = read_bytes("q6_K.blocks.bin");
    let gpu = repack_for_gpu(WeightFormat::Q6K, &blocks).expect("whole blocks");
    assert_eq!(gpu.len(), blocks.len() / 210 * 224);
    for (src, dst) in blocks.chunks_exact(210).zip(gpu.chunks_exact(224)) {
        assert_eq!(&dst[..210], src);
        assert_eq!(&dst[210..], &[0; 14]);
    }
    let q4 = read_bytes("q4_K.blocks.bin");
    assert_eq!(repack_for_gpu(WeightFormat::Q4K, &q4).expect("whole blocks"), q4);
    assert!(repack_for_gpu(WeightFormat::Q8_0, &blocks[..35]).is_err());
    // Appending into a reused buffer keeps earlier contents.
    let mut staging = vec![9u8];
    repack_for_gpu_into(WeightFormat::Q6K, &blocks[..210], &mut staging).expect("one block");
    assert_eq!(staging.len(), 225);
}

#[test]
fn dequantize_rejects_malformed_input() {
    let blocks = read_bytes("q4_K.blocks.bin");
    let mut out = vec![0.0f32; 512];
    assert!(matches!(
        dequantize(WeightFormat::Q4K, &blocks[..143], 256, &mut out),
        Err(QuantError::DataTooShort { needed: 144, got: 143, .. })
    ));
    assert!(matches!(
        dequantize(WeightFormat::Q4K, &blocks, 100, &mut out),
        Err(QuantError::PartialBlock { n_elems: 100, .. })
    ));
    assert!(matches!(
        dequantize(WeightFormat::Q4K, &blocks, 512, &mut out[..256]),
        Err(QuantError::OutputTooShort { .. })
    ));
    assert!(dequantize_row(WeightFormat::Q8_0, &[0u8; 33], &mut out[..32]).is_err());
    assert!(dequantize(WeightFormat::Q6K, &[], usize::MAX - 255, &mut out).is_err());
    assert!(dequantize(WeightFormat::F32, &[], 0, &mut []).is_ok());
}

#[test]
fn format_metadata() {
    let expected = [
        (WeightFormat::F32, 0, "F32", 1, 4, 4),
        (WeightFormat::F16, 1, "F16", 1, 2, 2),
        (WeightFormat::BF16, 30, "BF16", 1, 2, 2),
        (WeightFormat::Q8_0, 8, "Q8_0", 32, 34, 36),
        (WeightFormat::Q4K, 12, "Q4_K", 256, 144, 144),
        (WeightFormat::Q5K, 13, "Q5_K", 256, 176, 176),
        (WeightFormat::Q6K, 14, "Q6_K", 256, 210, 224),
    ];
    for (format, id, name, elems, bytes, gpu_bytes) in expected {
        assert_eq!(WeightFormat::from_ggml_type(id), Some(format));
        assert_eq!(format.ggml_type(), id);
        assert_eq!(format.name(), name);
        assert_eq!(WeightFormat::parse(name), Some(format));
        assert_eq!(WeightFormat::parse(&name.to_lowercase()), Some(format));
        assert_eq!((format.block_elems(), format.block_bytes(), format.gpu_block_bytes()), (elems, bytes, gpu_bytes));
    }
    assert_eq!(WeightFormat::parse("q4k"), Some(WeightFormat::Q4K));
    assert_eq!(WeightFormat::parse("Q80"), Some(WeightFormat::Q8_0));
    assert_eq!(WeightFormat::parse("q4_0"), None);
    assert_eq!(WeightFormat::from_ggml_type(2), None);
    assert_eq!(WeightFormat::Q4K.row_bytes(4096), Some(16 * 144));
    assert_eq!(WeightFormat::Q4K.row_bytes(100), None);
    assert_eq!(WeightFormat::Q6K.gpu_row_bytes(512), Some(448));
    assert_eq!(WeightFormat::Q8_0.tensor_bytes(3, 64), Some(3 * 68));
    assert_eq!(WeightFormat::F32.tensor_bytes(usize::MAX, 2), None);
}

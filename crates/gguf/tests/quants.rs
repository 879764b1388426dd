//! ggml block formats against committed reference vectors (tests/fixtures/quants, made by
//! tools/make_quant_vectors.py from gguf-py 0.19.0 and ggml-quants.c; MANIFEST.txt there says
//! which produced each file), plus round-trip error bounds and length errors.
//!
//! `QUANT_VECTORS_DIR` overrides the fixture folder, e.g. for a large local run made with
//! `make_quant_vectors.py --blocks-mult 200 --out /tmp/qv`.

use std::path::PathBuf;

use half::f16;
use mlaserve_gguf::quants::{
    can_dequantize, can_quantize, cast_blocks, dequantize, dequantize_blocks, dequantize_row,
    quantize, quantize_blocks, quantize_into, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K,
    BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1, QuantBlock, QuantError, QuantizeBlock,
};
use mlaserve_gguf::GgmlType::{self, *};
use proptest::prelude::*;

/// Every type with a dequantizer and a reference quantizer, in fixture order.
const TYPES: [GgmlType; 18] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL,
    IQ4_XS, MXFP4,
];

fn fixture(name: &str) -> Vec<u8> {
    let dir = std::env::var_os("QUANT_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quants")
        });
    let path = dir.join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn dequantized(ty: GgmlType, data: &[u8]) -> Vec<f32> {
    let n = data.len() / ty.type_size() * ty.block_size();
    let mut out = vec![f32::NAN; n];
    dequantize(ty, data, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
    out
}

/// Compare bit patterns; report the first differing element with its block.
fn assert_bits_eq(ty: GgmlType, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{ty} {what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{ty} {what}: element {i} (block {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
            i / ty.block_size(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

#[test]
fn every_listed_type_is_supported_and_others_are_not() {
    for ty in TYPES {
        assert!(can_dequantize(ty) && can_quantize(ty), "{ty}");
    }
    for ty in [
        IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M, TQ1_0, TQ2_0, I8, F64,
    ] {
        assert!(!can_dequantize(ty) && !can_quantize(ty), "{ty}");
    }
}

#[test]
fn block_structs_match_ggml_sizes() {
    fn check<const QK: usize, B: QuantBlock<QK>>() {
        assert_eq!(size_of::<B>(), B::TYPE.type_size(), "{}", B::TYPE);
        assert_eq!(QK, B::TYPE.block_size(), "{}", B::TYPE);
    }
    check::<32, BlockQ4_0>();
    check::<32, BlockQ4_1>();
    check::<32, BlockQ5_0>();
    check::<32, BlockQ5_1>();
    check::<32, BlockQ8_0>();
    check::<32, BlockQ8_1>();
    check::<256, BlockQ2K>();
    check::<256, BlockQ3K>();
    check::<256, BlockQ4K>();
    check::<256, BlockQ5K>();
    check::<256, BlockQ6K>();
    check::<256, BlockQ8K>();
    check::<32, BlockIQ4NL>();
    check::<256, BlockIQ4XS>();
    check::<32, BlockMXFP4>();
}

#[test]
fn dequantize_is_bit_exact_against_reference() {
    for ty in TYPES {
        let data = fixture(&format!("{ty}.bin"));
        let want = f32s(&fixture(&format!("{ty}.f32")));
        assert!(!want.is_empty(), "{ty}: empty fixture");
        assert_bits_eq(ty, "dequantize", &dequantized(ty, &data), &want);
    }
}

#[test]
fn dequantize_reads_unaligned_bytes() {
    for ty in TYPES {
        let data = fixture(&format!("{ty}.bin"));
        let mut shifted = vec![0u8; data.len() + 1];
        shifted[1..].copy_from_slice(&data);
        let aligned = dequantized(ty, &data);
        let mut out = vec![0.0; aligned.len()];
        dequantize_row(ty, &shifted[1..], &mut out).unwrap();
        assert_bits_eq(ty, "unaligned dequantize", &out, &aligned);
    }
}

#[test]
fn quantize_is_bit_exact_against_reference() {
    for ty in TYPES {
        let x = f32s(&fixture(&format!("{ty}.qin.f32")));
        let want = fixture(&format!("{ty}.qout.bin"));
        let mut got = Vec::new();
        quantize(ty, &x, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(got.len(), want.len(), "{ty}: quantized length");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let b = i / ty.type_size();
            let range = b * ty.type_size()..(b + 1) * ty.type_size();
            panic!(
                "{ty}: byte {i} (block {b}, offset {}) differs\n got  {:02x?}\n want {:02x?}",
                i % ty.type_size(),
                &got[range.clone()],
                &want[range]
            );
        }
    }
}

#[test]
fn quantize_appends_and_typed_blocks_agree_with_bytes() {
    let x = f32s(&fixture("Q8_K.qin.f32"));
    let mut bytes = vec![0xAB];
    quantize(Q8_K, &x, &mut bytes).unwrap();
    assert_eq!(bytes[0], 0xAB, "existing bytes are kept");
    let mut blocks = vec![<BlockQ8K as bytemuck::Zeroable>::zeroed(); x.len() / 256];
    quantize_blocks(&x, &mut blocks).unwrap();
    assert_eq!(bytemuck::cast_slice::<BlockQ8K, u8>(&blocks), &bytes[1..]);
    for b in &blocks {
        for (j, &sum) in b.bsums.iter().enumerate() {
            let want: i32 = b.qs[16 * j..16 * j + 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            assert_eq!(i32::from(sum), want);
        }
    }
    let mut out = vec![0.0; x.len()];
    dequantize_blocks(&blocks, &mut out).unwrap();
    assert_bits_eq(
        Q8_K,
        "typed dequantize",
        &out,
        &dequantized(Q8_K, &bytes[1..]),
    );
}

#[test]
fn cast_blocks_views_aligned_bytes_and_rejects_misaligned() {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.37).collect();
    let blocks: Vec<BlockQ8_0> = x
        .chunks_exact(32)
        .map(|c| BlockQ8_0::quantize(c.try_into().unwrap()))
        .collect();
    let bytes: &[u8] = bytemuck::cast_slice(&blocks);
    assert_eq!(cast_blocks::<32, BlockQ8_0>(bytes).unwrap(), &blocks[..]);
    assert!(matches!(
        cast_blocks::<32, BlockQ8_0>(&bytes[..33]),
        Err(QuantError::ByteLength { .. })
    ));
    let mut buf = vec![0u16; bytes.len() / 2 + 1];
    let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    raw[1..=bytes.len()].copy_from_slice(bytes);
    let err = cast_blocks::<32, BlockQ8_0>(&raw[1..=bytes.len()]).unwrap_err();
    assert!(
        matches!(err, QuantError::Misaligned { align: 2, .. }),
        "{err}"
    );
}

#[test]
fn bad_lengths_and_types_are_errors() {
    let mut out = vec![0.0f32; 32];
    let err = dequantize(Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::ByteLength {
                expected: 18,
                got: 17,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("Q4_0"), "{err}");
    let err = dequantize(Q4_K, &[0u8; 144], &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::PartialBlock {
                block_size: 256,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        dequantize(IQ2_XXS, &[0u8; 66], &mut [0.0; 256]),
        Err(QuantError::UnsupportedDequantize(IQ2_XXS))
    ));
    assert!(matches!(
        dequantize(F16, &[0u8; 3], &mut [0.0; 2]),
        Err(QuantError::ByteLength { .. })
    ));

    let mut v = Vec::new();
    assert!(matches!(
        quantize(Q8_0, &[1.0; 33], &mut v),
        Err(QuantError::PartialBlock { .. })
    ));
    assert!(v.is_empty(), "nothing appended on error");
    assert!(matches!(
        quantize(TQ2_0, &[1.0; 256], &mut v),
        Err(QuantError::UnsupportedQuantize(TQ2_0))
    ));
    assert!(matches!(
        quantize_into(Q8_0, &[1.0; 32], &mut [0u8; 35]),
        Err(QuantError::ByteLength {
            expected: 34,
            got: 35,
            ..
        })
    ));
    let mut blocks = [<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); 2];
    assert!(matches!(
        quantize_blocks(&[0.5; 32], &mut blocks),
        Err(QuantError::BlockCount {
            expected: 1,
            got: 2,
            ..
        })
    ));
    assert!(matches!(
        dequantize_blocks(&blocks, &mut [0.0; 63]),
        Err(QuantError::PartialBlock { .. })
    ));
    // Empty input is zero blocks, not an error.
    dequantize(Q6_K, &[], &mut []).unwrap();
}

#[test]
fn all_zero_blocks_quantize_to_zero() {
    for ty in TYPES {
        let n = ty.block_size().max(32);
        let mut q = Vec::new();
        quantize(ty, &vec![0.0; n], &mut q).unwrap();
        let back = dequantized(ty, &q);
        assert!(back.iter().all(|&v| v == 0.0), "{ty}: {back:?}");
    }
    // IQ4_NL writes index 0 for an empty block (current llama.cpp behaviour).
    let b = BlockIQ4NL::quantize(&[0.0; 32]);
    assert_eq!((b.d, b.qs), (f16::ZERO, [0; 16]));
}

/// Deterministic N(0, 1) samples (xorshift + Box-Muller), independent of any crate's RNG.
fn gaussian(n: usize, mut seed: u64) -> Vec<f32> {
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

#[test]
fn round_trip_rmse_of_gaussian_rows_is_within_type_bounds() {
    // Relative RMSE bounds ≈ 1.25 × what the reference quantizers reach on N(0, σ²) rows
    // (measured, worst of the three σ: Q8_0 0.0054, Q8_K 0.0077, Q6_K 0.020, Q5_K 0.037,
    // Q4_K 0.072, IQ4_XS 0.080, MXFP4 0.118, Q3_K 0.153, Q2_K 0.298). They catch gross errors
    // (wrong nibble order, lost scale bits), not last-bit ones: the vectors above do that.
    let bounds: [(GgmlType, f64); 18] = [
        (F32, 0.0),
        (F16, 3e-4),
        (BF16, 2.1e-3),
        (Q8_0, 6.8e-3),
        (Q8_1, 6.8e-3),
        (Q8_K, 9.7e-3),
        (Q6_K, 0.025),
        (Q5_0, 0.054),
        (Q5_1, 0.048),
        (Q5_K, 0.046),
        (Q4_0, 0.11),
        (Q4_1, 0.1),
        (Q4_K, 0.09),
        (IQ4_NL, 0.1),
        (IQ4_XS, 0.1),
        (MXFP4, 0.148),
        (Q3_K, 0.19),
        (Q2_K, 0.37),
    ];
    for (ty, bound) in bounds {
        for (seed, sigma) in [(1u64, 1.0f32), (2, 1e-3), (3, 250.0)] {
            let x: Vec<f32> = gaussian(4096, seed).iter().map(|v| v * sigma).collect();
            let mut q = Vec::new();
            quantize(ty, &x, &mut q).unwrap();
            let y = dequantized(ty, &q);
            let (err2, sig2) = x.iter().zip(&y).fold((0.0f64, 0.0f64), |(e, s), (&a, &b)| {
                (e + f64::from(a - b).powi(2), s + f64::from(a).powi(2))
            });
            let rel = (err2 / sig2).sqrt();
            assert!(
                rel <= bound,
                "{ty} σ={sigma}: relative RMSE {rel:.5} > {bound}"
            );
        }
    }
}

/// Max |x − dequant(quant(x))| allowed for one block, from the format's step size, the f16
/// rounding of its scale fields (relative 2^-11, plus subnormal absolute 2^-25), and a few
/// f32 ulps of amax for the products and quotients computed on the way.
fn max_error_bound(ty: GgmlType, x: &[f32]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (min, max) = x
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let f16_rel = 2f32.powi(-11);
    let f16_abs = 2f32.powi(-25);
    let ulps = (max - min).max(amax) * 2f32.powi(-20);
    ulps + match ty {
        Q8_0 | Q8_1 => amax * (0.5 / 127.0 + f16_rel) + 127.0 * f16_abs,
        Q8_K => amax * (0.5 / 127.0),
        Q4_0 => amax * (1.0 / 8.0 + f16_rel) + 8.0 * f16_abs,
        Q5_0 => amax * (1.0 / 16.0 + f16_rel) + 16.0 * f16_abs,
        Q4_1 | Q5_1 => {
            let levels = if ty == Q4_1 { 15.0 } else { 31.0 };
            (max - min) * (0.5 / levels + f16_rel) + min.abs() * f16_rel + 33.0 * f16_abs
        }
        // d = 2^(⌊log2 amax⌋ − 3): the largest level 12·d may sit 4·d ≤ amax/2 below amax.
        MXFP4 => amax * 0.5,
        _ => unreachable!("no analytic bound for {ty}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip_error_is_within_the_step_bound(
        x in prop::collection::vec(-1.0e4f32..1.0e4f32, 256),
        scale_exp in -20i32..3,
    ) {
        let scale = 2f32.powi(scale_exp);
        let x: Vec<f32> = x.iter().map(|v| v * scale).collect();
        for ty in [Q8_0, Q8_1, Q8_K, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4] {
            let mut q = Vec::new();
            quantize(ty, &x, &mut q).unwrap();
            let y = dequantized(ty, &q);
            for (xb, yb) in x.chunks(ty.block_size()).zip(y.chunks(ty.block_size())) {
                let bound = max_error_bound(ty, xb);
                for (a, b) in xb.iter().zip(yb) {
                    prop_assert!((a - b).abs() <= bound, "{ty}: {a} -> {b}, bound {bound}");
                }
            }
        }
    }

    #[test]
    fn dequantize_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..700)) {
        for ty in TYPES {
            let blocks = bytes.len() / ty.type_size();
            let data = &bytes[..blocks * ty.type_size()];
            let mut out = vec![0.0; blocks * ty.block_size()];
            prop_assert!(dequantize(ty, data, &mut out).is_ok());
            if !bytes.is_empty() {
                let short = out.len().saturating_sub(1);
                prop_assert!(dequantize(ty, &bytes, &mut out[..short]).is_err());
            }
        }
    }
}

/// Steady-state throughput of the conversions (buffers warmed by a first pass); run with
/// `cargo test --release -p mlaserve-gguf --test quants -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let n = 1 << 22;
    let x = gaussian(n, 7);
    let mut out = vec![0.0f32; n];
    for ty in [
        F16, BF16, Q8_0, Q8_1, Q4_0, Q4_1, Q5_0, Q5_1, Q8_K, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
        IQ4_XS, MXFP4,
    ] {
        let mut q = Vec::new();
        quantize(ty, &x, &mut q).unwrap();
        let t = std::time::Instant::now();
        quantize_into(ty, &x, &mut q).unwrap();
        let tq = t.elapsed().as_secs_f64();
        dequantize(ty, &q, &mut out).unwrap();
        let t = std::time::Instant::now();
        dequantize(ty, &q, &mut out).unwrap();
        let td = t.elapsed().as_secs_f64();
        println!(
            "{ty:>6}: quantize {:7.1} Melem/s, dequantize {:7.1} Melem/s",
            n as f64 / tq / 1e6,
            n as f64 / td / 1e6
        );
    }
}

//! Shared test helpers: a seeded RNG and random weight matrices of every supported type.
#![allow(dead_code)]

use mlaserve_backend::{Bytes, GgmlType, QMatrix};

/// Every weight type the backend multiplies.
pub const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

/// splitmix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// Offsets of the f16 scale fields of a block (written with sane values; every other byte
/// of a block is random, which exercises every bit pattern of quants and sub-block scales).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// A `[rows, cols]` matrix of `ty` with random contents.
pub fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> QMatrix {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let v = rng.vec(rows * cols, 1.0);
            let data: Vec<u8> = match ty {
                GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                GgmlType::F16 => v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
                    .collect(),
                _ => v
                    .iter()
                    .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
                    .collect(),
            };
            return QMatrix::new(ty, rows, cols, Bytes::from_vec(data)).unwrap();
        }
        _ => {}
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let n_blocks = rows * cols / bs;
    let mut data: Vec<u8> = (0..n_blocks * ts).map(|_| rng.next_u64() as u8).collect();
    for b in data.chunks_exact_mut(ts) {
        for &off in f16_fields(ty) {
            let v = 0.002 + 0.02 * (rng.uniform() + 1.0);
            put_f16(
                b,
                off,
                if rng.next_u64().is_multiple_of(2) {
                    v
                } else {
                    -v
                },
            );
        }
        match ty {
            GgmlType::Q8_K => b[0..4].copy_from_slice(&(0.01 + 0.01 * rng.uniform()).to_le_bytes()),
            GgmlType::MXFP4 => b[0] = 120 + (rng.next_u64() % 10) as u8,
            _ => {}
        }
    }
    QMatrix::new(ty, rows, cols, Bytes::from_vec(data)).unwrap()
}

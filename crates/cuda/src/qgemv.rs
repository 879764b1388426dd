//! GGUF weights kept compressed on the GPU: Q8_0 and Q4_K matrices as their raw ggml blocks
//! ([`QMat`]), the quantized GEMV `out[m, r] (+)= sum_k W[r, k] * x[m, k]` for x bf16 [M, K]
//! with M <= [`QGEMV_MAX_M`] (`kernels/qgemv.cu`), and a dequantize kernel (rows -> bf16) so
//! larger M runs as dequantize-to-scratch + cuBLAS ([`Gpu::qgemm`]).
//!
//! Invariants: a `QMat`'s bytes are `rows * row_bytes` of blocks, rows back to back, the
//! buffer padded with zeros to a multiple of 16 bytes (the Q8_0 kernel reads 16-byte aligned
//! words around each row chunk); `cols` is a multiple of the type's block size. The dequantized
//! values equal the CPU dequantizer's (`QMatrix::to_f32`) exactly; the dequantize kernel rounds
//! them to bf16 (nearest even), and the GEMV keeps them in f32.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use crate::ops::{Gemm, GemmType};
use mlaserve_gguf::GgmlType;

/// Largest batch the GEMV kernels take; larger batches dequantize and use cuBLAS.
pub const QGEMV_MAX_M: usize = 8;

/// A GGUF block type the GPU keeps compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    /// 32 values: f16 scale + 32 int8 (34 bytes).
    Q8_0,
    /// 256 values: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
    Q4K,
}

impl QType {
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        match t {
            GgmlType::Q8_0 => Some(QType::Q8_0),
            GgmlType::Q4_K => Some(QType::Q4K),
            _ => None,
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            QType::Q8_0 => GgmlType::Q8_0,
            QType::Q4K => GgmlType::Q4_K,
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            QType::Q8_0 => 32,
            QType::Q4K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QType::Q8_0 => 34,
            QType::Q4K => 144,
        }
    }

    /// Bytes of one row of `k` values.
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_values() * self.block_bytes()
    }

    fn tag(self) -> &'static str {
        match self {
            QType::Q8_0 => "q8_0",
            QType::Q4K => "q4_k",
        }
    }
}

/// A quantized matrix [rows, cols] on the device, raw ggml blocks (see the module invariants).
pub struct QMat {
    pub ty: QType,
    pub rows: usize,
    pub cols: usize,
    pub w: DBuf<u8>,
}

impl QMat {
    /// Bytes of blocks (without the padding).
    pub fn bytes(&self) -> usize {
        self.rows * self.ty.row_bytes(self.cols)
    }
}

/// One GEMV kernel: at most `mt` vectors per launch, `r` rows per warp (`qgemv_<ty>_m<mt>r<r>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QgemvVariant {
    pub mt: usize,
    pub r: usize,
}

impl QgemvVariant {
    /// Every kernel `qgemv.cu` instantiates (per type).
    pub const ALL: [QgemvVariant; 7] = [
        QgemvVariant { mt: 1, r: 1 },
        QgemvVariant { mt: 1, r: 2 },
        QgemvVariant { mt: 1, r: 4 },
        QgemvVariant { mt: 2, r: 2 },
        QgemvVariant { mt: 4, r: 2 },
        QgemvVariant { mt: 8, r: 1 },
        QgemvVariant { mt: 8, r: 2 },
    ];

    /// The kernel used for `m` vectors (1..=8).
    pub fn for_m(m: usize) -> Option<Self> {
        let (mt, r) = match m {
            1 => (1, 2),
            2 => (2, 2),
            3 | 4 => (4, 2),
            5..=8 => (8, 2),
            _ => return None,
        };
        Some(QgemvVariant { mt, r })
    }

    pub fn kernel(self, ty: QType) -> String {
        format!("qgemv_{}_m{}r{}", ty.tag(), self.mt, self.r)
    }

    /// Warps splitting K per row group (1, 2, 4 or 8): the smallest that gives at least
    /// 1024 CTAs of 8 warps (several waves on a 132-SM GPU), but no split leaving a warp
    /// fewer than two chunks of K.
    pub fn default_ksplit(self, ty: QType, rows: usize, k: usize) -> usize {
        // A warp step covers 1024 values of K for both types (32 Q8_0 blocks, 4 Q4_K blocks).
        let _ = ty;
        let chunks = k.div_ceil(1024);
        let mut ks = 1;
        while ks < 8 && self.ctas(rows, ks) < 1024 && chunks >= 4 * ks {
            ks *= 2;
        }
        ks
    }

    /// CTA items (8 / ksplit row groups of r rows each) over `rows` rows; a launch runs
    /// min(items, resident CTAs) CTAs, each walking items c, c + grid, ...
    pub fn ctas(self, rows: usize, ksplit: usize) -> usize {
        rows.div_ceil(8 / ksplit * self.r)
    }
}

impl Gpu {
    /// Uploads `bytes` (raw ggml blocks of a [rows, cols] matrix of `ty`), padded to 16 bytes.
    pub fn upload_qmat(&self, ty: QType, rows: usize, cols: usize, bytes: &[u8]) -> Result<QMat> {
        if cols % ty.block_values() != 0 {
            return Err(CudaError::Invalid(format!(
                "{ty:?} matrix with {cols} columns: not a multiple of the block size {}",
                ty.block_values()
            )));
        }
        let need = rows * ty.row_bytes(cols);
        if bytes.len() != need {
            return Err(CudaError::Invalid(format!(
                "{ty:?} [{rows} x {cols}] needs {need} bytes of blocks, got {}",
                bytes.len()
            )));
        }
        let padded = need.div_ceil(16) * 16;
        let w = self.alloc_filled::<u8>(padded.max(16), 0)?;
        if need > 0 {
            // SAFETY: w holds at least `need` bytes.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(w.ptr(), bytes, self.stream.cu_stream())
            }
            .map_err(|e| CudaError::driver("copy of quantized weights to the device", e))?;
        }
        Ok(QMat { ty, rows, cols, w })
    }

    /// out[m, r] (+)= W[r, :] . x[m, :] for m < `m` <= 8; x bf16 [m, cols] (16-byte aligned),
    /// out f32 [m, rows]. `accumulate` adds to out instead of overwriting it.
    pub fn qgemv(&self, w: &QMat, m: usize, x: u64, out: u64, accumulate: bool) -> Result<()> {
        let v = QgemvVariant::for_m(m).ok_or_else(|| {
            CudaError::Invalid(format!("qgemv takes 1..={QGEMV_MAX_M} vectors, got {m}"))
        })?;
        let ks = v.default_ksplit(w.ty, w.rows, w.cols);
        self.qgemv_variant(w, m, x, out, accumulate, v, ks, None)
    }

    /// [`Gpu::qgemv`] with an explicit kernel and K split (the lab sweeps these), and an
    /// optional cap on the grid (tests use it to make each CTA walk several items).
    #[allow(clippy::too_many_arguments)]
    pub fn qgemv_variant(
        &self,
        w: &QMat,
        m: usize,
        x: u64,
        out: u64,
        accumulate: bool,
        v: QgemvVariant,
        ksplit: usize,
        grid_cap: Option<usize>,
    ) -> Result<()> {
        if m == 0 || w.rows == 0 {
            return Ok(());
        }
        if m > v.mt || !matches!(ksplit, 1 | 2 | 4 | 8) {
            return Err(CudaError::Invalid(format!(
                "qgemv kernel {v:?} with {m} vectors and ksplit {ksplit}"
            )));
        }
        if x % 16 != 0 || w.w.bytes() < w.bytes().div_ceil(16) * 16 {
            return Err(CudaError::Invalid(
                "qgemv: x must be 16-byte aligned and the weights padded to 16 bytes".into(),
            ));
        }
        if w.rows > i32::MAX as usize || w.cols > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "qgemv shape [{} x {}] past the kernel's i32 indices",
                w.rows, w.cols
            )));
        }
        let (rows, k, m32, ks, acc) = (
            w.rows as i32,
            w.cols as i32,
            m as i32,
            ksplit as i32,
            accumulate as i32,
        );
        let wp = w.w.ptr();
        let name = v.kernel(w.ty);
        // Persistent grid: no more CTAs than fit on the GPU at once (each walks its items).
        let grid = v
            .ctas(w.rows, ksplit)
            .min(self.resident_ctas(&name)?)
            .min(grid_cap.unwrap_or(usize::MAX).max(1));
        self.launch(
            &name,
            Gpu::cfg((grid as u32, 1, 1), 256),
            &args![wp, x, out, rows, k, m32, ks, acc],
        )
    }

    /// CTAs of 256 threads of kernel `name` resident on the whole GPU at once (cached).
    fn resident_ctas(&self, name: &str) -> Result<usize> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static CACHE: OnceLock<Mutex<HashMap<(usize, String), usize>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        let key = (self.ordinal, name.to_string());
        if let Some(&n) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(n);
        }
        let per_sm = self
            .func(name)?
            .occupancy_max_active_blocks_per_multiprocessor(256, 0, None)
            .map_err(|e| CudaError::driver(format!("occupancy of {name}"), e))?;
        let sms = self
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| CudaError::driver("multiprocessor count", e))?;
        let n = (per_sm.max(1) as usize) * (sms.max(1) as usize);
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        Ok(n)
    }

    /// out [rows, cols] bf16 = the dequantized rows of `w` (16-byte aligned `out`).
    pub fn dequant_bf16(&self, w: &QMat, out: u64) -> Result<()> {
        if out % 16 != 0 {
            return Err(CudaError::Invalid(
                "dequant_bf16: out must be 16-byte aligned".into(),
            ));
        }
        let (name, threads) = match w.ty {
            QType::Q8_0 => ("dequant_q8_0_bf16", w.rows * (w.cols / 32)),
            QType::Q4K => ("dequant_q4_k_bf16", w.rows * (w.cols / 256) * 8),
        };
        let grid = threads.div_ceil(256).clamp(1, 65_535) as u32;
        let (wp, rows, k) = (w.w.ptr(), w.rows as i32, w.cols as i32);
        self.launch(name, Gpu::cfg((grid, 1, 1), 256), &args![wp, out, rows, k])
    }

    /// out[M, rows] (+)= x[M, cols] . W^T for any M: the GEMV up to [`QGEMV_MAX_M`] rows of x,
    /// else W dequantized to a bf16 scratch (step arena inside a step) and one cuBLAS GEMM.
    pub fn qgemm(&self, w: &QMat, m: usize, x: u64, out: u64, accumulate: bool) -> Result<()> {
        if m == 0 {
            return Ok(());
        }
        if m <= QGEMV_MAX_M {
            return self.qgemv(w, m, x, out, accumulate);
        }
        let scratch = self.alloc::<u16>(w.rows * w.cols)?;
        self.dequant_bf16(w, scratch.ptr())?;
        let g = Gemm::plain(GemmType::Bf16, m, w.rows, w.cols, x, scratch.ptr(), out);
        self.gemm(&if accumulate { g.accumulate() } else { g })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_a_loaded_kernel() {
        for ty in [QType::Q8_0, QType::Q4K] {
            for v in QgemvVariant::ALL {
                let name = v.kernel(ty);
                assert!(crate::kernels::NAMES.contains(&name.as_str()), "{name}");
                assert!(
                    crate::kernels::SOURCE.contains(&format!("({}, {}, {})", ty.tag(), v.mt, v.r)),
                    "{name} not instantiated"
                );
            }
            for m in 1..=QGEMV_MAX_M {
                let v = QgemvVariant::for_m(m).unwrap();
                assert!(
                    v.mt >= m && QgemvVariant::ALL.contains(&v),
                    "m {m} -> {v:?}"
                );
            }
        }
        assert!(QgemvVariant::for_m(0).is_none() && QgemvVariant::for_m(9).is_none());
    }

    #[test]
    fn ksplit_fills_the_gpu_without_starving_warps() {
        let v = QgemvVariant { mt: 1, r: 2 };
        // Many rows: no split needed.
        assert_eq!(v.default_ksplit(QType::Q4K, 18432, 7168), 1);
        // Few long rows: split while CTAs are short of 1024 and warps keep two chunks
        // (11 chunks of K = 10944: 4 warps of ~3 chunks each, 512 CTAs).
        assert_eq!(v.default_ksplit(QType::Q8_0, 2048, 10944), 4);
        assert_eq!(v.default_ksplit(QType::Q4K, 7168, 18432), 4);
        // Short rows: every warp keeps at least two 1024-value chunks.
        assert_eq!(v.default_ksplit(QType::Q8_0, 64, 2048), 1);
        assert_eq!(v.default_ksplit(QType::Q8_0, 64, 4096), 2);
    }
}

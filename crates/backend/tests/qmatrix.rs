//! QMatrix construction errors and zero-copy storage.

mod common;

use mlaserve_backend::{BackendError, Bytes, GgmlType, QMatrix};
use std::sync::Arc;

#[test]
fn new_rejects_bad_shapes_with_named_errors() {
    let e = QMatrix::new(GgmlType::Q4_K, 2, 255, Bytes::from_vec(vec![0; 288])).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::ColsNotBlockMultiple {
                cols: 255,
                block: 256,
                ..
            }
        ),
        "{e}"
    );
    let e = QMatrix::new(GgmlType::Q8_0, 2, 64, Bytes::from_vec(vec![0; 135])).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::SizeMismatch {
                expected: 136,
                got: 135,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("Q8_0"), "{e}");
    let e = QMatrix::new(GgmlType::IQ2_XXS, 1, 256, Bytes::from_vec(vec![0; 66])).unwrap_err();
    assert!(
        matches!(e, BackendError::UnsupportedType(GgmlType::IQ2_XXS)),
        "{e}"
    );
    let e = QMatrix::new(GgmlType::F32, usize::MAX / 2, 4, Bytes::from_vec(vec![])).unwrap_err();
    assert!(matches!(e, BackendError::ShapeOverflow { .. }), "{e}");
}

#[test]
fn matrix_over_a_shared_owner_reads_its_range() {
    // A fake "memory map": 8 bytes of header, then a 2x2 F32 matrix.
    let mut raw = vec![0xFFu8; 8];
    for v in [1.0f32, 2.0, 3.0, 4.0] {
        raw.extend_from_slice(&v.to_le_bytes());
    }
    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(raw);
    let m = QMatrix::new(GgmlType::F32, 2, 2, Bytes::from_arc(owner, 8..24)).unwrap();
    assert_eq!(m.to_f32(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(m.row_bytes(), 8);
    let mut row = vec![0f32; 2];
    m.rows_slice(1, 1).dequantize_row(0, &mut row);
    assert_eq!(row, vec![3.0, 4.0]);
}

#[test]
fn quantize_from_f32_float_types_round() {
    let v = vec![1.0f32, 1.0 + 1e-4, -2.5, 3.0e-3];
    let q = QMatrix::quantize_from_f32(GgmlType::BF16, 2, 2, &v).unwrap();
    let back = q.to_f32();
    assert_eq!(back[0], 1.0);
    assert_eq!(back[1], 1.0, "bf16 rounds 1+1e-4 to 1");
    assert_eq!(back[2], -2.5);
    let e = QMatrix::quantize_from_f32(GgmlType::F16, 2, 2, &v[..3]).unwrap_err();
    assert!(e.to_string().contains("3 values"), "{e}");
}

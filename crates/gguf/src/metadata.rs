//! GGUF metadata values: the 13 value types, typed arrays, display.
//!
//! Invariants: an [`Array`] is homogeneous and keeps its element type even when empty (so a
//! written file round-trips exactly); arrays of arrays may mix inner element types, as GGUF
//! allows. Arrays are stored as typed vectors (`Vec<u32>`, `Vec<String>`, ...) so a
//! 150k-token vocabulary costs one `String` per token and no per-element tag.
//! `Display` summarizes: arrays longer than [`DISPLAY_ARRAY_ITEMS`] items and strings longer
//! than [`DISPLAY_STRING_CHARS`] characters are cut (`Debug` shows everything).

use std::fmt;

/// Arrays longer than this are summarized by `Display`.
pub const DISPLAY_ARRAY_ITEMS: usize = 8;
/// Strings longer than this (in chars) are cut by `Display`.
pub const DISPLAY_STRING_CHARS: usize = 120;

/// A GGUF metadata value type, with its GGUF id as discriminant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8`.
    U8 = 0,
    /// `int8`.
    I8 = 1,
    /// `uint16`.
    U16 = 2,
    /// `int16`.
    I16 = 3,
    /// `uint32`.
    U32 = 4,
    /// `int32`.
    I32 = 5,
    /// `float32`.
    F32 = 6,
    /// `bool` (one byte, 0 or 1).
    Bool = 7,
    /// UTF-8 string with a u64 length.
    String = 8,
    /// Array: element type, u64 length, elements.
    Array = 9,
    /// `uint64`.
    U64 = 10,
    /// `int64`.
    I64 = 11,
    /// `float64`.
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`, or `None`.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes one value takes in a file, for fixed-size types; `None` for string and array.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The least number of bytes one value takes in a file (a string's or array's header).
    pub fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    /// True for the eight integer types.
    pub fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }

    /// Short name: "u8", "i32", "f32", "bool", "string", "array", ...
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // the variants are the GGUF value types, named alike
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array, stored as a typed vector.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // one variant per element type
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// Expands `$body` once per array variant with `$v` bound to the inner vector.
macro_rules! each_array {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            Array::U8($v) => $body,
            Array::I8($v) => $body,
            Array::U16($v) => $body,
            Array::I16($v) => $body,
            Array::U32($v) => $body,
            Array::I32($v) => $body,
            Array::F32($v) => $body,
            Array::Bool($v) => $body,
            Array::String($v) => $body,
            Array::Array($v) => $body,
            Array::U64($v) => $body,
            Array::I64($v) => $body,
            Array::F64($v) => $body,
        }
    };
}

impl Array {
    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as an `i64`, for integer arrays (`None` otherwise, or out of range).
    pub fn get_i64(&self, i: usize) -> Option<i64> {
        Some(match self {
            Array::U8(v) => i64::from(*v.get(i)?),
            Array::I8(v) => i64::from(*v.get(i)?),
            Array::U16(v) => i64::from(*v.get(i)?),
            Array::I16(v) => i64::from(*v.get(i)?),
            Array::U32(v) => i64::from(*v.get(i)?),
            Array::I32(v) => i64::from(*v.get(i)?),
            Array::U64(v) => i64::try_from(*v.get(i)?).ok()?,
            Array::I64(v) => *v.get(i)?,
            _ => return None,
        })
    }

    /// Type name with nesting, e.g. `[string]`, `[[u8]]` (inner type of the first element).
    pub fn type_name(&self) -> String {
        match self {
            Array::Array(v) => match v.first() {
                Some(inner) => format!("[{}]", inner.type_name()),
                None => "[array]".to_string(),
            },
            a => format!("[{}]", a.element_type()),
        }
    }

    /// Writes the first `n` elements, comma-separated, in display form.
    fn write_items(&self, f: &mut fmt::Formatter<'_>, n: usize) -> fmt::Result {
        fn list<T>(
            f: &mut fmt::Formatter<'_>,
            v: &[T],
            n: usize,
            one: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
        ) -> fmt::Result {
            for (i, x) in v.iter().take(n).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                one(f, x)?;
            }
            Ok(())
        }
        match self {
            Array::String(v) => list(f, v, n, |f, s| write_str_value(f, s)),
            Array::Array(v) => list(f, v, n, |f, a| write!(f, "{a}")),
            a => each_array!(a, v => list(f, v, n, |f, x| write!(f, "{x:?}"))),
        }
    }
}

/// Writes a string quoted, cut at [`DISPLAY_STRING_CHARS`] chars.
fn write_str_value(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    match s.char_indices().nth(DISPLAY_STRING_CHARS) {
        None => write!(f, "{s:?}"),
        Some((cut, _)) => write!(f, "{:?}… ({} bytes)", &s[..cut], s.len()),
    }
}

impl fmt::Display for Array {
    /// Short arrays: `[1, 2, 3]`. Long ones: `[u32; 1000] = [1, 2, 3, …]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.len();
        if n <= DISPLAY_ARRAY_ITEMS {
            f.write_str("[")?;
            self.write_items(f, n)?;
            f.write_str("]")
        } else {
            let inner = self.type_name();
            let inner = &inner[1..inner.len() - 1];
            write!(f, "[{inner}; {n}] = [")?;
            self.write_items(f, DISPLAY_ARRAY_ITEMS.min(4))?;
            f.write_str(", …]")
        }
    }
}

impl Value {
    /// The GGUF value type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Type name: `u32`, `string`, or for arrays the element type in brackets (`[string]`).
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => a.type_name(),
            v => v.value_type().name().to_string(),
        }
    }

    /// Any integer type widened to i128 (exact for every GGUF integer); `None` otherwise.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(x) => x.into(),
            Value::I8(x) => x.into(),
            Value::U16(x) => x.into(),
            Value::I16(x) => x.into(),
            Value::U32(x) => x.into(),
            Value::I32(x) => x.into(),
            Value::U64(x) => x.into(),
            Value::I64(x) => x.into(),
            _ => return None,
        })
    }

    /// An f32 or f64 as f64; `None` otherwise.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => None,
        }
    }

    /// The string, for a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, for a bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, for an array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    /// Numbers as Rust prints them, strings quoted (long ones cut), arrays summarized.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(x) => write!(f, "{x}"),
            Value::I8(x) => write!(f, "{x}"),
            Value::U16(x) => write!(f, "{x}"),
            Value::I16(x) => write!(f, "{x}"),
            Value::U32(x) => write!(f, "{x}"),
            Value::I32(x) => write!(f, "{x}"),
            Value::F32(x) => write!(f, "{x:?}"),
            Value::Bool(x) => write!(f, "{x}"),
            Value::String(s) => write_str_value(f, s),
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(x) => write!(f, "{x}"),
            Value::I64(x) => write!(f, "{x}"),
            Value::F64(x) => write!(f, "{x:?}"),
        }
    }
}

macro_rules! from_impls {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Self {
                Value::$variant(x)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Self {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Self {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}

from_impls!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64, Array => Array,
);

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_string())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Value::Array(Array::String(v.into_iter().map(str::to_string).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in 0..=12 {
            assert_eq!(ValueType::from_id(id).map(ValueType::id), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
    }

    #[test]
    fn display_summarizes_long_arrays_and_strings() {
        let v = Value::from((0u32..1000).collect::<Vec<_>>());
        assert_eq!(v.to_string(), "[u32; 1000] = [0, 1, 2, 3, …]");
        let v = Value::from(vec!["a", "b"]);
        assert_eq!(v.to_string(), r#"["a", "b"]"#);
        let long = "x".repeat(500);
        let shown = Value::from(long.as_str()).to_string();
        assert!(shown.ends_with("… (500 bytes)"), "{shown}");
        let nested = Value::Array(Array::Array(vec![Array::U8(vec![1]), Array::U8(vec![])]));
        assert_eq!(nested.to_string(), "[[1], []]");
        assert_eq!(nested.type_name(), "[[u8]]");
    }

    #[test]
    fn integers_widen_exactly() {
        assert_eq!(Value::U64(u64::MAX).as_integer(), Some(u64::MAX as i128));
        assert_eq!(Value::I8(-3).as_integer(), Some(-3));
        assert_eq!(Value::F32(1.0).as_integer(), None);
    }
}

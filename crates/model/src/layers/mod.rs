//! The layers of an MLA decoder, one concept per file.
pub mod attention;
pub mod dsa;
pub mod ffn;
pub mod mla;
pub mod rope;

//! The OpenAI wire format: request bodies (deserialized leniently: unknown fields are ignored,
//! as vLLM does) and response bodies (field names and shapes as OpenAI's and vLLM's).

pub mod chat;
pub mod common;
pub mod completion;

pub use chat::*;
pub use common::*;
pub use completion::*;

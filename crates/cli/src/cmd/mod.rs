//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod doctor;
pub mod generate;
pub mod inspect;
pub mod logits;
pub mod serve;

//! One module per subcommand.
pub mod bench;
pub mod doctor;
pub mod inspect;
pub mod logits;

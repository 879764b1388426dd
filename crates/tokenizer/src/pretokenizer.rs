//! The pre-tokenizer table for byte-level BPE vocabularies stored in GGUF files.
//!
//! GGUF records only the *name* of the pre-tokenizer (`tokenizer.ggml.pre`); the split regexes
//! live in the loader. This table follows llama.cpp's `llama-vocab.cpp` (which names map to which
//! pre-tokenizer type, and which types set `ignore_merges`), but uses the regexes as written in the
//! models' own `tokenizer.json` files: llama.cpp rewrites `(?i:'s|...)` into `'[sS]|...` only because
//! its own regex engine lacks inline flags, and we run HF's `tokenizers` with fancy-regex instead.
//!
//! Invariant: every spec is a sequence of `Split(regex, Isolated)` steps applied to the raw text
//! (each later regex re-splits the pieces of the earlier ones; text no regex matches stays a piece
//! of its own), followed by `ByteLevel(add_prefix_space = false, use_regex = false)` which maps the
//! bytes of each piece onto GPT-2's printable byte alphabet.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::TokenizerError;

/// The GPT-2 regex (HF's `ByteLevel(use_regex=True)`; llama.cpp "gpt-2"/"default").
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama-3 / GLM-4 regex: case-insensitive contractions, digits in groups of up to three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2 regex: like Llama-3 but single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5: like Qwen2 but combining marks stay with their letters.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek-V3 (also R1, V3.1, V3.2): digits by threes, CJK/kana runs, then a GPT-4-like rule.
const DEEPSEEK_V3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// DeepSeek-LLM (V1/V2 chat): newlines, Latin-ish letter runs, ASCII/fullwidth punctuation,
/// trailing whitespace, CJK/Hangul runs, digit runs.
const DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    // Non-ASCII code points written as \x{..} so no editor can re-normalize them.
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
];

/// DeepSeek-Coder (V1 and Coder-V2).
const DEEPSEEK_CODER: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}",
];

/// GPT-4o / Llama-4: cased word splitting, digits by threes.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tekken (Mistral Nemo): cased word splitting, single digits.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// StarCoder family: single digits first, then GPT-2.
const STARCODER: &[&str] = &[r"\p{N}", GPT2];

/// Falcon: punctuation runs, GPT-2, then digit triples.
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];

/// BLOOM / Poro / GPT-3-Finnish.
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// What a `tokenizer.ggml.pre` name means for the BPE pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    /// Split regexes, applied in order, each with `Isolated` behaviour.
    pub regexes: &'static [&'static str],
    /// Look a whole pre-token up in the vocabulary before merging (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// Add BOS by default when `tokenizer.ggml.add_bos_token` is absent (llama.cpp: Llama-3 family).
    pub add_bos: bool,
}

const fn spec(regexes: &'static [&'static str], ignore_merges: bool) -> PreTokenizerSpec {
    PreTokenizerSpec {
        regexes,
        ignore_merges,
        add_bos: false,
    }
}

/// `(names, spec)` rows; the first name of each row is the canonical one.
const TABLE: &[(&[&str], PreTokenizerSpec)] = &[
    (
        &[
            "default",
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        spec(&[GPT2], false),
    ),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
        ],
        PreTokenizerSpec {
            add_bos: true,
            ..spec(&[LLAMA3], true)
        },
    ),
    (&["smaug-bpe", "dbrx"], spec(&[LLAMA3], false)),
    (&["chatglm-bpe"], spec(&[LLAMA3], false)),
    (&["glm4", "glm5"], spec(&[LLAMA3], true)),
    (&["deepseek-llm"], spec(DEEPSEEK_LLM, false)),
    (&["deepseek-coder"], spec(DEEPSEEK_CODER, false)),
    (
        &["deepseek-v3", "hunyuan-dense", "joyai-llm"],
        spec(DEEPSEEK_V3, false),
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
        ],
        spec(&[QWEN2], false),
    ),
    (&["qwen35"], spec(&[QWEN35], false)),
    (
        &["gpt-4o", "llama4", "kanana2", "minimax-m2"],
        spec(&[GPT4O], false),
    ),
    (&["tekken"], spec(&[TEKKEN], false)),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        spec(STARCODER, false),
    ),
    (&["falcon"], spec(FALCON, false)),
    (
        &["bloom", "poro-chat", "gpt3-finnish"],
        spec(&[BLOOM], false),
    ),
    (&["viking"], spec(&[BLOOM, r"\p{N}"], false)),
];

/// Every `tokenizer.ggml.pre` value we accept, comma separated (for error messages and docs).
pub fn known_pre_tokenizers() -> String {
    TABLE
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Looks a `tokenizer.ggml.pre` value up. Unknown names are an error listing the known ones: a
/// silent fallback to GPT-2 would tokenize digits/CJK differently from training and quietly
/// degrade the model. (A *missing* key falls back to "default", as llama.cpp does — see
/// `gguf_vocab`.)
pub fn spec_for(pre: &str) -> Result<PreTokenizerSpec, TokenizerError> {
    TABLE
        .iter()
        .find(|(names, _)| names.contains(&pre))
        .map(|(_, spec)| *spec)
        .ok_or_else(|| TokenizerError::UnknownPreTokenizer {
            pre: pre.to_string(),
            known: known_pre_tokenizers(),
        })
}

/// Builds the `tokenizers` pre-tokenizer for a spec (see the module invariant).
pub fn build(spec: &PreTokenizerSpec) -> Result<PreTokenizerWrapper, TokenizerError> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for re in spec.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Backend(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    Ok(Sequence::new(steps).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let pt = build(&spec_for(pre).unwrap()).unwrap();
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn every_regex_compiles() {
        for (names, spec) in TABLE {
            build(spec).unwrap_or_else(|e| panic!("{names:?}: {e}"));
        }
    }

    #[test]
    fn gpt2_splits_words_with_leading_space() {
        assert_eq!(
            pieces("gpt-2", "Hello world's  end"),
            ["Hello", " world", "'s", " ", " end"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_folds_case_in_contractions() {
        assert_eq!(pieces("llama3", "12345 I'VE"), ["123", "45", " I", "'VE"]);
    }

    #[test]
    fn deepseek_v3_isolates_digit_triples_and_cjk() {
        assert_eq!(
            pieces("deepseek-v3", "ab1234我想x"),
            ["ab", "123", "4", "我想", "x"]
        );
    }

    #[test]
    fn unknown_pre_lists_known_ones() {
        let e = spec_for("no-such-pre").unwrap_err().to_string();
        assert!(
            e.contains("no-such-pre") && e.contains("deepseek-v3") && e.contains("glm4"),
            "{e}"
        );
    }
}

//! How byte-level BPE vocabularies cut text into words before merging, selected by
//! `tokenizer.ggml.pre`. The regexes are llama.cpp's (`llm_tokenizer_bpe` in
//! src/llama-vocab.cpp), applied in order: each splits every piece left by the previous one,
//! keeping both the matches and the text between them.

/// GPT-2's word regex, which many others extend.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// CJK ideographs, U+0800..U+4E00 and Hangul, as literal ranges the way llama.cpp has them.
const DEEPSEEK_CJK: &str = "[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]+";

/// Cased letters, listed as DeepSeek LLM's tokenizer.json does (escaped: several of them
/// have canonical equivalents that editors silently substitute).
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    "\\s?[A-Za-z\u{00B5}\u{00C0}-\u{00D6}\u{00D8}-\u{00F6}\u{00F8}-\u{01BA}",
    "\u{01BC}-\u{01BF}\u{01C4}-\u{0293}\u{0295}-\u{02AF}\u{0370}-\u{0373}\u{0376}\u{0377}",
    "\u{037B}-\u{037D}\u{037F}\u{0386}\u{0388}-\u{038A}\u{038C}\u{038E}-\u{03A1}",
    "\u{03A3}-\u{03F5}\u{03F7}-\u{0481}\u{048A}-\u{052F}\u{0531}-\u{0556}",
    "\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}",
    "\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}",
    "\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}",
    "\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}",
    "\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}",
    "\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}",
    "\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}",
    "\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}",
    "\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}",
    "\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}",
    "\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}",
    "\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}",
    "\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
);

/// ASCII and full-width punctuation, quotation marks, ideographic space and full stop.
const DEEPSEEK_LLM_PUNCT: &str = "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+";

/// A pre-tokenizer: the regexes and the options llama.cpp ties to them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pre {
    pub name: &'static str,
    pub regexes: &'static [&'static str],
    /// A word that is itself a token is not merged (Llama 3).
    pub ignore_merges: bool,
    /// llama.cpp's add_bos when the file does not say.
    pub add_bos: bool,
}

const fn pre(name: &'static str, regexes: &'static [&'static str]) -> Pre {
    Pre { name, regexes, ignore_merges: false, add_bos: false }
}

/// llama.cpp's `default`, which is GPT-2's plus splits at punctuation and digits.
const DEFAULT: Pre = pre("default", &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]);

const KNOWN: &[(&[&str], Pre)] = &[
    (&["default"], DEFAULT),
    (
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"],
        Pre { ignore_merges: true, add_bos: true, ..pre("llama-bpe", &[LLAMA3]) },
    ),
    (&["dbrx", "smaug-bpe"], pre("dbrx", &[LLAMA3])),
    (&["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"], pre("qwen2", &[QWEN2])),
    (
        &["deepseek-llm"],
        pre("deepseek-llm", &[r"[\r\n]", DEEPSEEK_LLM_LETTERS, DEEPSEEK_LLM_PUNCT, r"\s+$", DEEPSEEK_CJK, r"\p{N}+"]),
    ),
    (&["deepseek-coder"], pre("deepseek-coder", &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"])),
    (&["falcon"], pre("falcon", &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"])),
    (
        &["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"],
        pre("starcoder", &[r"\p{N}", GPT2]),
    ),
    (&["gpt-2", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de"], pre("gpt-2", &[GPT2])),
];

impl Pre {
    /// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`. Where the name is missing
    /// or unknown, llama.cpp's `default` (llama.cpp itself refuses unknown names).
    pub fn from_name(name: Option<&str>) -> Pre {
        let Some(name) = name else {
            tracing::warn!(
                "the file names no pre-tokenizer (tokenizer.ggml.pre); using llama.cpp's \
                 default, which may split words differently from the model's own tokenizer"
            );
            return DEFAULT;
        };
        match KNOWN.iter().find(|(names, _)| names.contains(&name)) {
            Some((_, pre)) => *pre,
            None => {
                tracing::warn!(
                    "pre-tokenizer {name:?} (tokenizer.ggml.pre) is unknown to kiln; using \
                     llama.cpp's default, which may split words differently from the model's \
                     own tokenizer"
                );
                DEFAULT
            }
        }
    }
}

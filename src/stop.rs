//! Stop strings (llama.cpp's reverse prompts, `-r`): generation ends as soon as the text
//! generated so far contains one of them. The text is shown through the end of the stop
//! string, as llama.cpp shows it, and nothing after it.

/// Watches streamed text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    strings: Vec<String>,
    /// The end of the text seen so far: enough to find a stop string that starts in an
    /// earlier piece (its longest length less one byte).
    tail: String,
    keep: usize,
}

impl StopStrings {
    /// Empty strings are ignored (they would stop before the first token).
    pub fn new(strings: impl IntoIterator<Item = String>) -> StopStrings {
        let strings: Vec<String> = strings.into_iter().filter(|s| !s.is_empty()).collect();
        let keep = strings.iter().map(String::len).max().unwrap_or(1) - 1;
        StopStrings { strings, tail: String::new(), keep }
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    /// Takes the next piece of text; returns how many of its bytes to show and whether a stop
    /// string ended there (then generation stops).
    pub fn push(&mut self, piece: &str) -> (usize, bool) {
        if self.strings.is_empty() {
            return (piece.len(), false);
        }
        let seen = self.tail.len();
        let text = format!("{}{piece}", self.tail);
        // The earliest end of a stop string in the new text (one wholly inside the tail was
        // already found, and stopped generation).
        let end = self
            .strings
            .iter()
            .filter_map(|s| text.match_indices(s.as_str()).map(|(i, m)| i + m.len()).find(|&end| end > seen))
            .min();
        if let Some(end) = end {
            return (end - seen, true);
        }
        let mut cut = text.len().saturating_sub(self.keep);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.tail = text[cut..].to_string();
        (piece.len(), false)
    }
}

/// llama.cpp's escape processing (`-e`): `\n`, `\r`, `\t`, `\'`, `\"`, `\\`, `\a`, `\b`,
/// `\f`, `\v`, `\?` and `\xHH` (a byte; bytes that do not form UTF-8 become U+FFFD). Any other
/// backslash is kept as it is.
pub fn process_escapes(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let decoded = match b[i + 1] {
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'\'' => Some(b'\''),
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'a' => Some(0x07),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'v' => Some(0x0b),
            b'?' => Some(b'?'),
            _ => None,
        };
        if let Some(c) = decoded {
            out.push(c);
            i += 2;
            continue;
        }
        if b[i + 1] == b'x' {
            let hex: Vec<u8> = b[i + 2..].iter().take(2).take_while(|c| c.is_ascii_hexdigit()).copied().collect();
            if let Some(v) = std::str::from_utf8(&hex).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 2 + hex.len();
                continue;
            }
        }
        out.push(b'\\');
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`; returns the text shown and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()));
        let mut shown = String::new();
        for p in pieces {
            let (n, hit) = s.push(p);
            shown.push_str(&p[..n]);
            if hit {
                return (shown, true);
            }
        }
        (shown, false)
    }

    #[test]
    fn stops_at_the_end_of_the_first_stop_string() {
        assert_eq!(run(&["User:"], &["Hello", " there.", " User: hi"]), ("Hello there. User:".into(), true));
        // Across pieces, and the earliest of several.
        assert_eq!(run(&["xyz", "lo w"], &["hel", "lo", " wor", "ld"]), ("hello w".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a\n\n".into(), true));
        assert_eq!(run(&["none"], &["some", "thing"]), ("something".into(), false));
        assert_eq!(run(&[], &["a"]), ("a".into(), false));
        // Multi-byte text around the tail cut.
        assert_eq!(run(&["ééé!"], &["éé", "é", "!x"]), ("ééé!".into(), true));
    }

    #[test]
    fn escapes_as_llama_cpp() {
        assert_eq!(process_escapes(r#"a\nb\tc\\d\'\"\?"#), "a\nb\tc\\d'\"?");
        assert_eq!(process_escapes(r"\x41\x4a\x4"), "AJ\x04");
        assert_eq!(process_escapes(r"\xc3\xa9"), "é");
        assert_eq!(process_escapes(r"C:\path\q"), "C:\\path\\q");
        assert_eq!(process_escapes("end\\"), "end\\");
    }
}

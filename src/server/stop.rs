//! OpenAI's `stop` strings on streamed text: generation ends where one begins, the stop string
//! itself is not returned, and no streamed chunk ever shows part of one. Text that could be the
//! start of a stop string is held back until the next piece settles it.

/// Filters generated text for stop strings, holding back a possible stop-string prefix.
#[derive(Debug, Clone, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    /// Text not yet released: the longest end of what was seen that a stop string starts with.
    held: String,
}

impl StopFilter {
    /// Empty strings are ignored (they would stop before any text).
    pub fn new(stops: &[String]) -> StopFilter {
        StopFilter { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Takes the next piece of text; returns the text that can be shown now and whether a
    /// stop string was found (the text then ends where it begins, and generation stops).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (piece.to_string(), false);
        }
        self.held.push_str(piece);
        // The earliest stop string wins (a match can only begin in the held text: everything
        // released before it could not start one).
        let found = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = found {
            let text = self.held[..at].to_string();
            self.held.clear();
            return (text, true);
        }
        let keep = self.longest_partial_suffix();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        (text, false)
    }

    /// The text held at the end of generation (no stop string followed it).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of the held text that are a proper prefix of some stop string.
    fn longest_partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for s in &self.stops {
            // Lengths of proper prefixes that end on a character boundary, longest first.
            for len in (best + 1..s.len().min(held.len() + 1)).rev() {
                if s.is_char_boundary(len) && held.ends_with(&s[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`; returns the chunks released, whether a stop string ended the text, and
    /// the text held at the end.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopFilter::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let (text, hit) = f.push(p);
            out.push(text);
            if hit {
                return (out, true, String::new());
            }
        }
        let rest = f.finish();
        (out, false, rest)
    }

    #[test]
    fn the_stop_string_and_what_follows_are_never_shown() {
        let (chunks, hit, _) = run(&["User:"], &["Hello", " there.", " User: hi"]);
        assert!(hit);
        assert_eq!(chunks.concat(), "Hello there. ");
        // Split over pieces: the prefix is held until the string completes.
        let (chunks, hit, _) = run(&["STOP"], &["ab S", "T", "OP cd"]);
        assert!(hit);
        assert_eq!(chunks, ["ab ", "", ""]);
        // The earliest of several.
        let (chunks, hit, _) = run(&["xyz", "lo w"], &["hel", "lo", " wor", "ld"]);
        assert!(hit);
        assert_eq!(chunks.concat(), "hel");
    }

    #[test]
    fn a_prefix_that_does_not_complete_is_released() {
        let (chunks, hit, rest) = run(&["STOP"], &["a ST", "x", "b"]);
        assert!(!hit);
        assert_eq!(chunks, ["a ", "STx", "b"]);
        assert_eq!(rest, "");
        // Held at the end of generation: returned by finish.
        let (chunks, hit, rest) = run(&["\n\n"], &["a\n"]);
        assert!(!hit);
        assert_eq!((chunks.concat(), rest.as_str()), ("a".to_string(), "\n"));
        // No stop strings: everything at once.
        assert_eq!(run(&[], &["a", "b"]).0, ["a", "b"]);
    }

    #[test]
    fn multibyte_prefixes_end_on_character_boundaries() {
        let (chunks, hit, _) = run(&["éé!"], &["xé", "é", "!"]);
        assert!(hit);
        assert_eq!(chunks.concat(), "x");
        let (chunks, hit, rest) = run(&["éa"], &["é", "é", "b"]);
        assert!(!hit);
        assert_eq!(chunks.concat() + &rest, "ééb");
    }
}

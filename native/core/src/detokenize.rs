//! Incremental detokenization: text deltas from a growing token stream, equal in sum to decoding
//! the whole stream at once, with stop strings cut out.
//!
//! Byte-level tokenizers (Llama 3, DeepSeek, GPT-style, tiktoken) decode by concatenating each
//! token's bytes and reading them as UTF-8 with replacement. The decoder does exactly that,
//! keeping back only an unfinished character at the end: a character split across tokens (byte
//! fallback, emoji, CJK) comes out once complete, and invalid bytes become U+FFFD just where a
//! one-shot decode puts them. Other decoders (which merge neighbouring tokens, strip prefix spaces,
//! ...) are decoded over a short window of recent ids, emitting only what the window adds once it
//! does not end in an incomplete character.
//!
//! Stop strings: with `with_stop_strings`, the last `longest stop - 1` bytes of text are held back,
//! so no part of a stop string is ever emitted; when one appears, the text before it is the last
//! delta and the decoder stops.

use crate::tokenize::TextTokenizer;

#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    skip_special_tokens: bool,
    /// Byte-level path: bytes not yet emitted (an incomplete character at the end).
    pending: Vec<u8>,
    /// Window path: all ids, the window start, and where the window's emitted text ends.
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    force_window: bool,
    stops: StopStrings,
}

#[derive(Debug, Default)]
struct StopStrings {
    stops: Vec<String>,
    /// Bytes kept back: one less than the longest stop string.
    holdback: usize,
    held: String,
    hit: Option<usize>,
}

impl IncrementalDecoder {
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            skip_special_tokens,
            ..Default::default()
        }
    }

    /// A decoder that never emits any part of one of `stops`, and stops at the first one.
    pub fn with_stop_strings(skip_special_tokens: bool, stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let holdback = stops.iter().map(String::len).max().unwrap_or(0).saturating_sub(1);
        IncrementalDecoder {
            skip_special_tokens,
            stops: StopStrings {
                stops,
                holdback,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Decode through the window path even for byte-level tokenizers (for tests).
    pub fn windowed(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            skip_special_tokens,
            force_window: true,
            ..Default::default()
        }
    }

    /// Add tokens; return the text safe to emit now (possibly empty).
    pub fn push(&mut self, tokenizer: &TextTokenizer, new_ids: &[u32]) -> String {
        if self.stops.hit.is_some() {
            return String::new();
        }
        let text = match tokenizer.byte_decoder().filter(|_| !self.force_window) {
            Some(bytes) => {
                bytes.extend(new_ids, self.skip_special_tokens, &mut self.pending);
                self.complete_utf8()
            }
            None => {
                self.ids.extend_from_slice(new_ids);
                self.window(tokenizer, false)
            }
        };
        self.stops.filter(text, false)
    }

    /// Everything still held back (an incomplete character at the very end becomes U+FFFD, as in
    /// a one-shot decode).
    pub fn flush(&mut self, tokenizer: &TextTokenizer) -> String {
        if self.stops.hit.is_some() {
            return String::new();
        }
        let text = if self.pending.is_empty() {
            self.window(tokenizer, true)
        } else {
            let text = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            text
        };
        self.stops.filter(text, true)
    }

    /// The stop string that ended the text, once one did.
    pub fn stopped_on(&self) -> Option<&str> {
        self.stops.hit.map(|i| self.stops.stops[i].as_str())
    }

    /// The longest prefix of the pending bytes that a one-shot decode would render the same
    /// whatever bytes follow: complete characters, and invalid sequences as U+FFFD.
    fn complete_utf8(&mut self) -> String {
        let mut out = String::new();
        let mut at = 0;
        loop {
            match std::str::from_utf8(&self.pending[at..]) {
                Ok(valid) => {
                    out.push_str(valid);
                    at = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[at..at + valid]).expect("validated"));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            at += valid + bad;
                        }
                        None => {
                            at += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..at);
        out
    }

    fn window(&mut self, tokenizer: &TextTokenizer, force: bool) -> String {
        if self.read_offset == self.ids.len() {
            return String::new();
        }
        let skip = self.skip_special_tokens;
        let before = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], skip);
        let after = tokenizer.decode(&self.ids[self.prefix_offset..], skip);
        let complete = !after.ends_with('\u{FFFD}');
        if after.len() > before.len() && (complete || force) {
            let delta = after.get(before.len()..).unwrap_or_default().to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return delta;
        }
        String::new()
    }
}

impl StopStrings {
    fn filter(&mut self, text: String, last: bool) -> String {
        if self.stops.is_empty() {
            return text;
        }
        self.held.push_str(&text);
        // Any stop string not yet seen must end in new text, so it starts within what is held.
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, stop)| self.held.find(stop.as_str()).map(|at| (at, i)))
            .min();
        if let Some((at, i)) = first {
            self.hit = Some(i);
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let mut cut = if last {
            self.held.len()
        } else {
            self.held.len().saturating_sub(self.holdback)
        };
        while !self.held.is_char_boundary(cut) {
            cut -= 1;
        }
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama3() -> TextTokenizer {
        TextTokenizer::from_file(&crate::test_assets::llama3_tokenizer_json()).expect("the Llama 3 tokenizer")
    }

    /// xorshift64: deterministic pseudo-random numbers without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn stream(tok: &TextTokenizer, mut decoder: IncrementalDecoder, ids: &[u32], rng: &mut Rng) -> String {
        let mut out = String::new();
        let mut at = 0;
        while at < ids.len() {
            let n = (1 + rng.below(4) as usize).min(ids.len() - at);
            out.push_str(&decoder.push(tok, &ids[at..at + n]));
            at += n;
        }
        out + &decoder.flush(tok)
    }

    #[test]
    fn streaming_equals_one_shot_for_random_ids() {
        let tok = llama3();
        let mut rng = Rng(0x5EED);
        let vocab = tok.vocab_size() as u64;
        for round in 0..400 {
            let len = 1 + rng.below(40) as usize;
            // Mostly byte tokens (ids < 256 hold the single bytes), so characters split across ids.
            let ids: Vec<u32> = (0..len)
                .map(|_| {
                    if rng.below(3) == 0 {
                        rng.below(vocab) as u32
                    } else {
                        rng.below(256) as u32
                    }
                })
                .collect();
            let skip = round % 2 == 0;
            let whole = tok.decode(&ids, skip);
            assert_eq!(
                stream(&tok, IncrementalDecoder::new(skip), &ids, &mut rng),
                whole,
                "{ids:?}"
            );
        }
    }

    #[test]
    fn window_path_agrees_on_real_text() {
        let tok = llama3();
        let mut rng = Rng(7);
        let text = "Grüße 👋🏽 from 東京! <|eot_id|> code: fn main() { println!(\"hi\"); }\n\n  done";
        let ids = tok.encode(text).unwrap();
        for skip in [false, true] {
            let whole = tok.decode(&ids, skip);
            assert_eq!(stream(&tok, IncrementalDecoder::windowed(skip), &ids, &mut rng), whole);
            assert_eq!(stream(&tok, IncrementalDecoder::new(skip), &ids, &mut rng), whole);
        }
    }

    #[test]
    fn stop_strings_are_never_emitted() {
        let tok = llama3();
        let ids = tok.encode("The answer is 42. STOP here and more").unwrap();
        for chunk in 1..4 {
            let mut decoder = IncrementalDecoder::with_stop_strings(false, vec!["STOP".into(), "zzz".into()]);
            let mut out = String::new();
            for piece in ids.chunks(chunk) {
                let delta = decoder.push(&tok, piece);
                out.push_str(&delta);
                assert!(!out.contains('S'), "emitted part of the stop string: {out:?}");
            }
            out.push_str(&decoder.flush(&tok));
            assert_eq!(out, "The answer is 42. ");
            assert_eq!(decoder.stopped_on(), Some("STOP"));
        }
        // Without a stop in the text, everything comes out by the flush.
        let mut decoder = IncrementalDecoder::with_stop_strings(false, vec!["never".into()]);
        let out = decoder.push(&tok, &ids) + &decoder.flush(&tok);
        assert_eq!(out, "The answer is 42. STOP here and more");
    }
}

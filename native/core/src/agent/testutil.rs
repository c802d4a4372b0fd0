//! Test helpers shared by the parser modules: run a parser over a text split in every way and check that
//! the merged result never depends on the split.

use super::{OutputParser, Parsed};

/// Everything a parser returned for one choice, merged the way a client merges stream deltas.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Merged {
    pub content: String,
    pub reasoning: String,
    /// (name, arguments) per call, in index order.
    pub calls: Vec<(String, String)>,
}

impl Merged {
    fn add(&mut self, p: Parsed) {
        self.content.push_str(&p.content);
        self.reasoning.push_str(&p.reasoning);
        for piece in p.calls {
            let i = piece.index as usize;
            if i == self.calls.len() {
                let name = piece.name.expect("a call's first piece carries its name");
                self.calls.push((name, piece.arguments));
            } else {
                assert!(i + 1 == self.calls.len(), "pieces of an earlier call after a later one");
                assert!(piece.name.is_none(), "a call's name is sent once");
                self.calls[i].1.push_str(&piece.arguments);
            }
        }
    }
}

/// The merged result of pushing `pieces` one after the other, then finishing.
pub(crate) fn run(parser: &mut dyn OutputParser, pieces: &[&str]) -> Merged {
    let mut merged = Merged::default();
    for piece in pieces {
        merged.add(parser.push(piece));
    }
    merged.add(parser.finish());
    merged
}

/// A parser as a stream runs it (`stream_calls` on, no declared tools).
pub(crate) fn streaming(make: &dyn Fn() -> Box<dyn OutputParser>) -> Box<dyn OutputParser> {
    let mut parser = make();
    parser.stream_calls(None);
    parser
}

/// Parses `text` whole, split in two at every char boundary, and one char at a time, as a whole answer
/// and as a stream; asserts every run gives the whole-text result and that each call's arguments are a
/// JSON object; returns that result. (For well-formed calls: a stream keeps a malformed call whose name
/// it sent, see `parse_whole_splits`.)
pub(crate) fn parse_all_splits(make: &dyn Fn() -> Box<dyn OutputParser>, text: &str) -> Merged {
    let whole = parse_whole_splits(make, text);
    for (i, _) in text.char_indices().skip(1) {
        let split = run(streaming(make).as_mut(), &[&text[..i], &text[i..]]);
        assert_eq!(split, whole, "streamed, split at byte {i} of {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    let by_char = run(streaming(make).as_mut(), &pieces);
    assert_eq!(by_char, whole, "streamed one char at a time: {text:?}");
    whole
}

/// `parse_all_splits` for a whole answer only.
pub(crate) fn parse_whole_splits(make: &dyn Fn() -> Box<dyn OutputParser>, text: &str) -> Merged {
    let whole = run(make().as_mut(), &[text]);
    for (i, _) in text.char_indices().skip(1) {
        let split = run(make().as_mut(), &[&text[..i], &text[i..]]);
        assert_eq!(split, whole, "split at byte {i} of {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(make().as_mut(), &pieces), whole, "one char at a time: {text:?}");
    for (name, args) in &whole.calls {
        let v: serde_json::Value = serde_json::from_str(args).expect("arguments are JSON");
        assert!(v.is_object(), "arguments of {name} are an object: {args}");
    }
    whole
}

/// A call as a test expects it: arguments given as JSON text, compared as the compact serialization.
pub(crate) fn call(name: &str, args: &str) -> (String, String) {
    let v: serde_json::Value = serde_json::from_str(args).unwrap();
    (name.to_string(), v.to_string())
}

/// The expected merged result.
pub(crate) fn expect(content: &str, reasoning: &str, calls: &[(String, String)]) -> Merged {
    Merged {
        content: content.into(),
        reasoning: reasoning.into(),
        calls: calls.to_vec(),
    }
}

/// Pushes a long plain text one char at a time and checks the parser passed it all through as content.
pub(crate) fn long_plain_text_streams(make: &dyn Fn() -> Box<dyn OutputParser>) {
    let text = "plain words, no markup. ".repeat(4200);
    let mut parser = make();
    let mut merged = Merged::default();
    for c in text.chars() {
        let mut b = [0u8; 4];
        let p = parser.push(c.encode_utf8(&mut b));
        // Held-back text is bounded by a marker's length: content keeps flowing as it arrives.
        merged.add(p);
        assert!(text.len() >= merged.content.len());
    }
    assert!(merged.content.len() + 64 >= text.trim_end().len());
    merged.add(parser.finish());
    assert_eq!(merged.content, text);
}

/// Pushes `prefix`, then 100 000 filler chars, then `suffix`, one char at a time, and asserts the parsers'
/// searches examined a bounded number of bytes per byte of output (a parser that re-scanned its buffer per
/// delta would examine billions), and that the result is the whole-text result.
pub(crate) fn assert_linear(make: &dyn Fn() -> Box<dyn OutputParser>, prefix: &str, suffix: &str) {
    let text = format!("{prefix}{}{suffix}", "ab cd ".repeat(100_000 / 6));
    let whole = run(make().as_mut(), &[&text]);
    for stream in [false, true] {
        super::scan::WORK.with(|w| w.set(0));
        let mut parser = if stream { streaming(make) } else { make() };
        let mut merged = Merged::default();
        for c in text.chars() {
            merged.add(parser.push(c.encode_utf8(&mut [0u8; 4])));
        }
        merged.add(parser.finish());
        let work = super::scan::WORK.with(|w| w.get());
        assert!(
            work < 80 * text.len(),
            "{work} bytes examined for {} bytes of output (stream: {stream})",
            text.len()
        );
        assert_eq!(merged, whole, "stream: {stream}");
    }
}

/// A parser as a stream runs it when the request declared the tools `names`.
pub(crate) fn declaring(make: &dyn Fn() -> Box<dyn OutputParser>, names: &[&str]) -> Box<dyn OutputParser> {
    let mut parser = make();
    parser.stream_calls(Some(std::sync::Arc::new(names.iter().map(|n| n.to_string()).collect())));
    parser
}

/// The call pieces each push of `parts` (then the finish) gave: (index, name, arguments) per piece.
pub(crate) fn call_pieces(parser: &mut dyn OutputParser, parts: &[&str]) -> Vec<Vec<(u32, Option<String>, String)>> {
    let pieces = |p: Parsed| p.calls.into_iter().map(|c| (c.index, c.name, c.arguments)).collect();
    let mut all: Vec<Vec<_>> = parts.iter().map(|t| pieces(parser.push(t))).collect();
    all.push(pieces(parser.finish()));
    all
}

/// A piece as `call_pieces` lists it.
pub(crate) fn piece(index: u32, name: Option<&str>, arguments: &str) -> (u32, Option<String>, String) {
    (index, name.map(str::to_string), arguments.to_string())
}

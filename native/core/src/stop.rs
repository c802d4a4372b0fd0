//! Stop strings over a stream of text deltas: a match may span deltas, and the stop string (and
//! anything after it) never reaches the client unless asked for.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop: bool,
    /// Text not yet emitted because it could be the start of a stop string.
    held: String,
    /// Bytes to hold back: the longest stop string minus one.
    window: usize,
    stopped: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>, include_stop: bool) -> Self {
        let window = stops.iter().map(String::len).max().unwrap_or(0).saturating_sub(1);
        StopMatcher {
            stops,
            include_stop,
            window,
            ..Default::default()
        }
    }

    /// The stop string that ended the text, once one matched.
    pub fn matched(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Take a delta; return the text that is safe to emit now.
    pub fn push(&mut self, delta: &str) -> String {
        if self.stopped.is_some() || delta.is_empty() {
            return String::new();
        }
        if self.stops.is_empty() {
            return delta.to_string();
        }
        self.held.push_str(delta);
        // The earliest match wins, as if the text had been scanned from the start.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, s)| (*at, std::cmp::Reverse(s.len())));
        if let Some((at, stop)) = first {
            let end = if self.include_stop { at + stop.len() } else { at };
            let out = self.held[..end].to_string();
            self.stopped = Some(stop.clone());
            self.held.clear();
            return out;
        }
        let mut keep_from = self.held.len().saturating_sub(self.window);
        while !self.held.is_char_boundary(keep_from) {
            keep_from -= 1;
        }
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        out
    }

    /// The end of the text: whatever is still held was not a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], include: bool, deltas: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include);
        let mut out: String = deltas.iter().map(|d| m.push(d)).collect();
        if m.matched().is_none() {
            out.push_str(&m.flush());
        }
        (out, m.matched().map(str::to_string))
    }

    #[test]
    fn stop_split_across_deltas_is_caught_and_not_emitted() {
        assert_eq!(
            run(&["END"], false, &["hello E", "N", "D tail"]),
            ("hello ".into(), Some("END".into()))
        );
    }

    #[test]
    fn include_stop_str_in_output() {
        assert_eq!(
            run(&["END"], true, &["a EN", "D b"]),
            ("a END".into(), Some("END".into()))
        );
    }

    #[test]
    fn held_text_is_released_when_no_stop_follows() {
        assert_eq!(run(&["END"], false, &["abc E", "N", "x"]), ("abc ENx".into(), None));
    }

    #[test]
    fn earliest_match_wins_and_multibyte_text_is_safe() {
        assert_eq!(
            run(&["zz", "é!"], false, &["caf", "é", "! zz"]),
            ("caf".into(), Some("é!".into()))
        );
        assert_eq!(run(&["xyz"], false, &["日本", "語"]), ("日本語".into(), None));
    }

    #[test]
    fn every_split_of_a_text_gives_the_same_result() {
        let text = "The quick brown fox says STOP and more";
        for i in 0..text.len() {
            for j in i..text.len() {
                let (a, b, c) = (&text[..i], &text[i..j], &text[j..]);
                assert_eq!(run(&["STOP", "zzz"], false, &[a, b, c]).0, "The quick brown fox says ");
            }
        }
    }
}

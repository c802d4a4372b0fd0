//! Server-sent events, as far as MCP's streamable HTTP needs them: the `data` of each event, in order.
//!
//! Bytes arrive in arbitrary chunks; only whole lines are read (a line break never falls inside a UTF-8
//! sequence), so a chunk boundary anywhere is fine. `event`, `id` and `retry` fields and comments are
//! dropped: MCP's messages are all in `data`.

#[derive(Default)]
pub struct SseParser {
    /// Bytes of a line not finished yet.
    pending: Vec<u8>,
    /// The data lines of the event being read, joined by '\n'.
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds a chunk; returns the data of every event the chunk completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(end) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.pending[start..start + end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start += end + 1;
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
        }
        self.pending.drain(..start);
        events
    }

    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            // A blank line ends the event; one without data dispatches nothing.
            let has_data = std::mem::take(&mut self.has_data);
            let data = std::mem::take(&mut self.data);
            return has_data.then_some(data);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = "event: message\r\ndata: {\"a\":\r\ndata:  \"é\"}\r\n\r\n: ping\n\nid: 3\ndata: two\n\n";
        let bytes = stream.as_bytes();
        for split in 0..bytes.len() {
            let mut parser = SseParser::default();
            let mut events = parser.push(&bytes[..split]);
            events.extend(parser.push(&bytes[split..]));
            assert_eq!(events, ["{\"a\":\n \"é\"}", "two"], "split at {split}");
        }
    }

    #[test]
    fn an_unfinished_event_is_not_dispatched() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: x\n").is_empty());
        assert_eq!(parser.push(b"\n"), ["x"]);
    }
}

//! The bookkeeping of calls as a parser announces them, for the parsers with their own state machine
//! (Llama 3, pythonic, Mistral, Harmony, forced tool choice): call indexes, whether this choice streams
//! calls and which names it may send early, and a streamed call's name and argument text sent so far.
//!
//! The rule is the one `tagged.rs` follows: a call streams only once its name is certain and declared; when
//! it closes, the rest of its decoded arguments follows if they extend what was sent (they do by
//! construction for well-formed calls), and a call whose name was sent stays a call whatever follows.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Parsed, ToolCallPiece};

/// A choice's calls: the next index, and whether (and for which names) it streams them.
#[derive(Default)]
pub(crate) struct Calls {
    /// None: a whole answer; Some(None): a stream with no declared tools (any name streams).
    stream: Option<Option<Arc<HashSet<String>>>>,
    /// Calls announced so far (the next call's index).
    pub count: u32,
}

impl Calls {
    pub fn stream(&mut self, declared: Option<Arc<HashSet<String>>>) {
        self.stream = Some(declared);
    }

    /// This choice streams calls.
    pub fn streams(&self) -> bool {
        self.stream.is_some()
    }

    /// A call named `name` may be sent before it closes.
    pub fn may_stream(&self, name: &str) -> bool {
        match &self.stream {
            None => false,
            Some(None) => true,
            Some(Some(names)) => names.contains(name),
        }
    }

    /// A call announced whole.
    pub fn whole(&mut self, name: String, arguments: String, out: &mut Parsed) {
        out.calls.push(ToolCallPiece {
            index: self.count,
            name: Some(name),
            id: None,
            arguments,
        });
        self.count += 1;
    }

    /// A call's first piece: its name and the argument text known so far.
    pub fn start(&mut self, name: String, arguments: String, out: &mut Parsed) -> SentCall {
        let sent = SentCall {
            index: self.count,
            name: name.clone(),
            args: arguments.clone(),
        };
        self.whole(name, arguments, out);
        sent
    }
}

/// A call whose name has been sent.
pub(crate) struct SentCall {
    index: u32,
    name: String,
    args: String,
}

impl SentCall {
    /// More argument text.
    pub fn more(&mut self, arguments: &str, out: &mut Parsed) {
        if arguments.is_empty() {
            return;
        }
        out.calls.push(ToolCallPiece {
            index: self.index,
            name: None,
            id: None,
            arguments: arguments.to_string(),
        });
        self.args.push_str(arguments);
    }

    /// The call closed as `decoded` (None: malformed, the call stays as sent): the rest of its arguments.
    pub fn close(mut self, decoded: Option<(String, String)>, out: &mut Parsed) {
        if let Some((name, arguments)) = decoded {
            if name == self.name {
                if let Some(rest) = arguments.strip_prefix(self.args.as_str()) {
                    let rest = rest.to_string();
                    self.more(&rest, out);
                }
            }
        }
    }
}

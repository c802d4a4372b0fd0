//! Added (special and user-defined) tokens: found in the text before anything else runs.
//!
//! As in `tokenizers`: leftmost-longest matching, first of the tokens that match the raw text
//! (`normalized: false`), then, inside the stretches between those, of the ones matched after
//! normalization (`normalized: true`; the fast path only runs with the identity normalizer).
//! Everything between two added tokens is tokenized on its own, which is what makes the prefix
//! cache exact at these boundaries.

use std::ops::Range;

/// A byte trie over the tokens' UTF-8, walked from each candidate start.
#[derive(Default)]
struct Trie {
    /// Whether any token starts with this byte: most positions are rejected by one load.
    first: Vec<bool>,
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    edges: Vec<(u8, u32)>,
    token: Option<u32>,
}

impl Trie {
    fn new<'a>(tokens: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let mut trie = Trie {
            first: vec![false; 256],
            nodes: vec![TrieNode::default()],
        };
        for (content, id) in tokens {
            if content.is_empty() {
                continue;
            }
            trie.first[content.as_bytes()[0] as usize] = true;
            let mut node = 0usize;
            for &b in content.as_bytes() {
                node = match trie.nodes[node].edges.iter().find(|e| e.0 == b) {
                    Some(&(_, child)) => child as usize,
                    None => {
                        trie.nodes.push(TrieNode::default());
                        let child = trie.nodes.len() - 1;
                        trie.nodes[node].edges.push((b, child as u32));
                        child
                    }
                };
            }
            // The first token with this content keeps it, as in the added vocabulary.
            trie.nodes[node].token.get_or_insert(id);
        }
        trie
    }

    fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }

    /// Longest token starting at `at`.
    fn longest_at(&self, bytes: &[u8], at: usize) -> Option<(u32, usize)> {
        let mut node = 0usize;
        let mut best = None;
        for (offset, &b) in bytes[at..].iter().enumerate() {
            match self.nodes[node].edges.iter().find(|e| e.0 == b) {
                Some(&(_, child)) => node = child as usize,
                None => break,
            }
            if let Some(id) = self.nodes[node].token {
                best = Some((id, at + offset + 1));
            }
        }
        best
    }

    /// Calls `f` with the text stretches and the tokens of `range`, in order.
    fn split(&self, text: &str, range: Range<usize>, f: &mut impl FnMut(Piece)) {
        let bytes = text.as_bytes();
        let mut start = range.start;
        let mut at = range.start;
        while at < range.end {
            if self.first[bytes[at] as usize] {
                if let Some((id, end)) = self.longest_at(&bytes[..range.end], at) {
                    if start < at {
                        f(Piece::Text(start..at));
                    }
                    f(Piece::Token(id, at..end));
                    start = end;
                    at = end;
                    continue;
                }
            }
            at += 1;
        }
        if start < range.end {
            f(Piece::Text(start..range.end));
        }
    }
}

/// A stretch of text to tokenize, or an added token.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(Range<usize>),
    Token(u32, Range<usize>),
}

pub struct AddedTokens {
    raw: Trie,
    normalized: Trie,
}

/// One entry of `added_tokens` with the flags the fast path supports.
pub struct AddedToken<'a> {
    pub content: &'a str,
    pub id: u32,
    pub normalized: bool,
}

impl AddedTokens {
    pub fn new(tokens: &[AddedToken]) -> Self {
        AddedTokens {
            raw: Trie::new(tokens.iter().filter(|t| !t.normalized).map(|t| (t.content, t.id))),
            normalized: Trie::new(tokens.iter().filter(|t| t.normalized).map(|t| (t.content, t.id))),
        }
    }

    /// The pieces of `text`, in order.
    pub fn split(&self, text: &str, f: &mut impl FnMut(Piece)) {
        if self.normalized.is_empty() {
            return self.raw.split(text, 0..text.len(), f);
        }
        self.raw.split(text, 0..text.len(), &mut |piece| match piece {
            Piece::Text(range) => self.normalized.split(text, range, f),
            token => f(token),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(added: &AddedTokens, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        added.split(text, &mut |p| out.push(p));
        out
    }

    #[test]
    fn leftmost_longest_then_normalized_tokens() {
        let added = AddedTokens::new(&[
            AddedToken {
                content: "<|a|>",
                id: 1,
                normalized: false,
            },
            AddedToken {
                content: "<|a|>b",
                id: 2,
                normalized: false,
            },
            AddedToken {
                content: "<x>",
                id: 3,
                normalized: true,
            },
            AddedToken {
                content: "|a",
                id: 4,
                normalized: true,
            },
        ]);
        assert_eq!(
            pieces(&added, "q<|a|>b<|a|><x>"),
            vec![
                Piece::Text(0..1),
                Piece::Token(2, 1..7),
                Piece::Token(1, 7..12),
                Piece::Token(3, 12..15)
            ]
        );
        // "<|a" is no raw token; the normalized pass then finds "|a" inside the leftover text.
        assert_eq!(pieces(&added, "<|a"), vec![Piece::Text(0..1), Piece::Token(4, 1..3)]);
        assert_eq!(pieces(&added, ""), vec![]);
    }
}

//! The regular expressions of pre-tokenizers, matched by a small backtracking matcher.
//!
//! Pre-tokenizer patterns (GPT-2, cl100k, Llama 3, DeepSeek, ...) are alternations of short
//! sequences of quantified character classes, with the odd lookahead, case-insensitive group or
//! end anchor. This module parses exactly that subset and matches it with Perl/Oniguruma semantics
//! (leftmost match; alternatives in order; greedy quantifiers backtrack, possessive ones do not).
//! Anything outside the subset is refused at parse time, and the tokenizer then falls back to the
//! `tokenizers` crate, so an unusual pattern costs speed, never correctness.

use super::unicode::{self, Props};

/// Whose regex syntax the pattern is written in: they disagree on a few spellings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dialect {
    /// Oniguruma with Ruby syntax, as `tokenizers` compiles `Split` patterns: `{n,m}+` is a
    /// repetition of a repetition and `$` matches before any newline, so both are refused here.
    Oniguruma,
    /// Rust `regex`/`fancy-regex`, as tiktoken compiles its patterns: `{n,m}+` is possessive and
    /// `$` is the end of the text.
    Fancy,
}

#[derive(Clone, Debug)]
enum Atom {
    Props(Props, bool),
    Range(u32, u32),
}

#[derive(Clone, Debug)]
struct Class {
    /// Membership of the 128 ASCII characters, negation applied.
    ascii: u128,
    negated: bool,
    atoms: Vec<Atom>,
}

/// The characters a match can start with (a superset), to skip alternatives cheaply.
#[derive(Clone, Copy, Debug)]
struct FirstChars {
    ascii: u128,
    non_ascii: bool,
}

impl FirstChars {
    const NONE: FirstChars = FirstChars {
        ascii: 0,
        non_ascii: false,
    };
    const ANY: FirstChars = FirstChars {
        ascii: u128::MAX,
        non_ascii: true,
    };

    fn add(&mut self, other: FirstChars) {
        self.ascii |= other.ascii;
        self.non_ascii |= other.non_ascii;
    }

    #[inline]
    fn admits(&self, c: char) -> bool {
        if (c as u32) < 128 {
            self.ascii >> (c as u32) & 1 == 1
        } else {
            self.non_ascii
        }
    }

    /// What a sequence can start with, and whether it can match the empty string.
    fn of_sequence(nodes: &[Node]) -> (FirstChars, bool) {
        let mut first = FirstChars::NONE;
        for node in nodes {
            let (chars, nullable) = match node {
                Node::Set { class, min, .. } => (class.first_chars(), *min == 0),
                Node::Group { alts, optional, .. } => {
                    let mut chars = FirstChars::NONE;
                    let mut nullable = *optional;
                    for alt in alts {
                        let (c, n) = FirstChars::of_sequence(alt);
                        chars.add(c);
                        nullable |= n;
                    }
                    (chars, nullable)
                }
                // Assertions consume nothing; ignoring them keeps the set a superset.
                Node::NotAhead(_) | Node::Ahead(_) | Node::End => (FirstChars::NONE, true),
            };
            first.add(chars);
            if !nullable {
                return (first, false);
            }
        }
        (first, true)
    }
}

impl Class {
    fn new(atoms: Vec<Atom>, negated: bool) -> Self {
        let mut class = Class {
            ascii: 0,
            negated,
            atoms,
        };
        for b in 0u8..128 {
            if class.contains_slow(b as char) {
                class.ascii |= 1u128 << b;
            }
        }
        class
    }

    fn contains_slow(&self, c: char) -> bool {
        let cp = c as u32;
        let mut props = None;
        let inside = self.atoms.iter().any(|atom| match *atom {
            Atom::Range(lo, hi) => lo <= cp && cp <= hi,
            Atom::Props(bits, negated) => {
                let p = *props.get_or_insert_with(|| unicode::props(c));
                (p & bits != 0) != negated
            }
        });
        inside != self.negated
    }

    fn first_chars(&self) -> FirstChars {
        let non_ascii = self.negated
            || self.atoms.iter().any(|a| match *a {
                Atom::Props(..) => true,
                Atom::Range(_, hi) => hi >= 128,
            });
        FirstChars {
            ascii: self.ascii,
            non_ascii,
        }
    }

    #[inline]
    fn contains(&self, c: char) -> bool {
        if (c as u32) < 128 {
            self.ascii >> (c as u32) & 1 == 1
        } else {
            self.contains_slow(c)
        }
    }
}

#[derive(Clone, Debug)]
enum Node {
    Set {
        class: Class,
        min: u32,
        max: u32,
        possessive: bool,
    },
    Group {
        alts: Vec<Vec<Node>>,
        optional: bool,
        possessive: bool,
    },
    NotAhead(Vec<Vec<Node>>),
    Ahead(Vec<Vec<Node>>),
    End,
}

/// A compiled pre-tokenizer pattern.
#[derive(Clone, Debug)]
pub struct Pattern {
    alts: Vec<Vec<Node>>,
    /// Per alternative, the characters it can start with.
    firsts: Vec<FirstChars>,
}

/// Continuation: what must still match after the current sequence (for groups inside sequences).
struct Cont<'a> {
    nodes: &'a [Node],
    next: Option<&'a Cont<'a>>,
}

#[inline]
fn char_at(text: &str, pos: usize) -> Option<char> {
    let b = *text.as_bytes().get(pos)?;
    if b < 0x80 {
        Some(b as char)
    } else {
        text[pos..].chars().next()
    }
}

#[inline]
fn prev_boundary(text: &str, mut pos: usize) -> usize {
    pos -= 1;
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    pos
}

fn run(text: &str, nodes: &[Node], pos: usize, k: Option<&Cont>) -> Option<usize> {
    let Some((node, rest)) = nodes.split_first() else {
        return match k {
            None => Some(pos),
            Some(c) => run(text, c.nodes, pos, c.next),
        };
    };
    match node {
        Node::Set {
            class,
            min,
            max,
            possessive,
        } => {
            let (mut end, mut count) = (pos, 0u32);
            while count < *max {
                match char_at(text, end) {
                    Some(c) if class.contains(c) => {
                        end += c.len_utf8();
                        count += 1;
                    }
                    _ => break,
                }
            }
            if count < *min {
                return None;
            }
            if *possessive {
                return run(text, rest, end, k);
            }
            loop {
                if let Some(found) = run(text, rest, end, k) {
                    return Some(found);
                }
                if count == *min {
                    return None;
                }
                end = prev_boundary(text, end);
                count -= 1;
            }
        }
        Node::Group {
            alts,
            optional,
            possessive,
        } => {
            if *possessive {
                // Atomic: the group's first match is final.
                match alts.iter().find_map(|alt| run(text, alt, pos, None)) {
                    Some(end) => run(text, rest, end, k),
                    None if *optional => run(text, rest, pos, k),
                    None => None,
                }
            } else {
                let cont = Cont { nodes: rest, next: k };
                alts.iter()
                    .find_map(|alt| run(text, alt, pos, Some(&cont)))
                    .or_else(|| if *optional { run(text, rest, pos, k) } else { None })
            }
        }
        Node::NotAhead(alts) => {
            if alts.iter().any(|alt| run(text, alt, pos, None).is_some()) {
                None
            } else {
                run(text, rest, pos, k)
            }
        }
        Node::Ahead(alts) => {
            if alts.iter().any(|alt| run(text, alt, pos, None).is_some()) {
                run(text, rest, pos, k)
            } else {
                None
            }
        }
        Node::End => {
            if pos == text.len() {
                run(text, rest, pos, k)
            } else {
                None
            }
        }
    }
}

impl Pattern {
    pub fn parse(source: &str, dialect: Dialect) -> Result<Pattern, String> {
        let mut parser = Parser {
            chars: source.chars().collect(),
            at: 0,
            dialect,
        };
        let alts = parser.alternation(false)?;
        if parser.at != parser.chars.len() {
            return Err(format!("unbalanced ')' at {}", parser.at));
        }
        let firsts = alts
            .iter()
            .map(|alt| match FirstChars::of_sequence(alt) {
                (_, true) => FirstChars::ANY,
                (first, false) => first,
            })
            .collect();
        Ok(Pattern { alts, firsts })
    }

    /// The end of the match starting exactly at `pos` (before the end of `text`), if any.
    #[inline]
    fn match_at(&self, text: &str, pos: usize) -> Option<usize> {
        let c = char_at(text, pos)?;
        self.alts
            .iter()
            .zip(&self.firsts)
            .filter(|(_, first)| first.admits(c))
            .find_map(|(alt, _)| run(text, alt, pos, None))
    }

    /// Calls `f(start, end)` for each leftmost, non-overlapping match, like a regex `find_iter`.
    pub fn find_iter(&self, text: &str, mut f: impl FnMut(usize, usize)) {
        let mut pos = 0;
        while pos < text.len() {
            match self.match_at(text, pos) {
                Some(end) if end > pos => {
                    f(pos, end);
                    pos = end;
                }
                // Patterns that match the empty string are refused at parse time; advance anyway.
                _ => pos += char_at(text, pos).map_or(1, char::len_utf8),
            }
        }
    }
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    dialect: Dialect,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn next(&mut self) -> Result<char, String> {
        let c = self.peek().ok_or("unexpected end of pattern")?;
        self.at += 1;
        Ok(c)
    }

    fn alternation(&mut self, icase: bool) -> Result<Vec<Vec<Node>>, String> {
        let mut alts = vec![self.sequence(icase)?];
        while self.eat('|') {
            alts.push(self.sequence(icase)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, icase: bool) -> Result<Vec<Node>, String> {
        let mut nodes = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let node = self.atom(icase)?;
            let node = self.quantified(node)?;
            nodes.push(node);
        }
        Ok(nodes)
    }

    fn atom(&mut self, icase: bool) -> Result<Node, String> {
        let c = self.next()?;
        let set = |atoms: Vec<Atom>, negated| Node::Set {
            class: Class::new(atoms, negated),
            min: 1,
            max: 1,
            possessive: false,
        };
        Ok(match c {
            '(' => {
                if self.eat('?') {
                    match self.next()? {
                        ':' => self.group(icase)?,
                        '!' => Node::NotAhead(self.closed_alternation(icase)?),
                        '=' => Node::Ahead(self.closed_alternation(icase)?),
                        'i' if self.eat(':') => self.group(true)?,
                        other => return Err(format!("unsupported group (?{other}")),
                    }
                } else {
                    self.group(icase)?
                }
            }
            '[' => {
                let (atoms, negated) = self.class(icase)?;
                set(atoms, negated)
            }
            '\\' => match self.escape()? {
                Escaped::Atom(atom) => {
                    if icase {
                        case_safe(&atom)?;
                    }
                    set(vec![atom], false)
                }
                Escaped::Char(c) => set(literal(c, icase)?, false),
            },
            '$' if self.dialect == Dialect::Fancy => Node::End,
            '.' | '^' | '$' => return Err(format!("unsupported '{c}'")),
            '*' | '+' | '?' | '{' => return Err(format!("quantifier '{c}' without an operand")),
            c => set(literal(c, icase)?, false),
        })
    }

    fn closed_alternation(&mut self, icase: bool) -> Result<Vec<Vec<Node>>, String> {
        let alts = self.alternation(icase)?;
        if !self.eat(')') {
            return Err("missing ')'".into());
        }
        Ok(alts)
    }

    fn group(&mut self, icase: bool) -> Result<Node, String> {
        let alts = self.closed_alternation(icase)?;
        Ok(Node::Group {
            alts,
            optional: false,
            possessive: false,
        })
    }

    fn quantified(&mut self, node: Node) -> Result<Node, String> {
        let brace = self.peek() == Some('{');
        let (min, max) = match self.peek() {
            Some('?') => (0, 1),
            Some('*') => (0, u32::MAX),
            Some('+') => (1, u32::MAX),
            Some('{') => (0, 0),
            _ => return Ok(node),
        };
        self.at += 1;
        let (min, max) = if brace { self.braces()? } else { (min, max) };
        let possessive = match self.peek() {
            Some('+') if brace && self.dialect == Dialect::Oniguruma => {
                return Err("'{n,m}+' (a repeated repetition in Oniguruma) is not supported".into())
            }
            Some('+') => {
                self.at += 1;
                true
            }
            Some('?') => return Err("lazy quantifiers are not supported".into()),
            _ => false,
        };
        match node {
            Node::Set {
                class, min: 1, max: 1, ..
            } => Ok(Node::Set {
                class,
                min,
                max,
                possessive,
            }),
            Node::Group { alts, .. } if (min, max) == (0, 1) => Ok(Node::Group {
                alts,
                optional: true,
                possessive,
            }),
            _ => Err("unsupported quantifier on a group or assertion".into()),
        }
    }

    /// `{n}`, `{n,}` or `{n,m}` starting after the '{'; consumes the closing '}'.
    fn braces(&mut self) -> Result<(u32, u32), String> {
        let mut text = String::new();
        loop {
            match self.next()? {
                '}' => break,
                c => text.push(c),
            }
        }
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("bad repetition {{{text}}}"))
        };
        let (min, max) = match text.split_once(',') {
            None => {
                let n = number(&text)?;
                (n, n)
            }
            Some((lo, "")) => (number(lo)?, u32::MAX),
            Some((lo, hi)) => (number(lo)?, number(hi)?),
        };
        if min > max || max == 0 {
            return Err(format!("bad repetition {{{text}}}"));
        }
        Ok((min, max))
    }

    fn class(&mut self, icase: bool) -> Result<(Vec<Atom>, bool), String> {
        let negated = self.eat('^');
        let mut atoms = Vec::new();
        let mut first = true;
        loop {
            let c = self.next()?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = match c {
                '[' => return Err("nested classes are not supported".into()),
                '\\' => match self.escape()? {
                    Escaped::Atom(atom) => {
                        if icase {
                            case_safe(&atom)?;
                        }
                        atoms.push(atom);
                        continue;
                    }
                    Escaped::Char(c) => c,
                },
                c => c,
            };
            // A range `lo-hi`, unless the '-' is the last character of the class.
            let hi = if self.peek() == Some('-') && self.chars.get(self.at + 1) != Some(&']') {
                self.at += 1;
                match self.next()? {
                    '\\' => match self.escape()? {
                        Escaped::Char(c) => c,
                        Escaped::Atom(_) => return Err("class shorthand as a range end".into()),
                    },
                    c => c,
                }
            } else {
                lo
            };
            if hi < lo {
                return Err(format!("bad range {lo}-{hi}"));
            }
            if icase {
                for c in lo..=hi {
                    atoms.extend(literal(c, true)?);
                }
            } else {
                atoms.push(Atom::Range(lo as u32, hi as u32));
            }
        }
        Ok((atoms, negated))
    }

    fn escape(&mut self) -> Result<Escaped, String> {
        let c = self.next()?;
        Ok(match c {
            's' => Escaped::Atom(Atom::Props(unicode::SPACE, false)),
            'S' => Escaped::Atom(Atom::Props(unicode::SPACE, true)),
            'p' | 'P' => {
                if !self.eat('{') {
                    return Err("\\p without braces".into());
                }
                let mut name = String::new();
                loop {
                    match self.next()? {
                        '}' => break,
                        c => name.push(c),
                    }
                }
                let (name, negated) = match name.strip_prefix('^') {
                    Some(rest) => (rest.to_string(), c == 'p'),
                    None => (name, c == 'P'),
                };
                let bits = unicode::property(&name).ok_or(format!("unsupported property \\p{{{name}}}"))?;
                Escaped::Atom(Atom::Props(bits, negated))
            }
            'r' => Escaped::Char('\r'),
            'n' => Escaped::Char('\n'),
            't' => Escaped::Char('\t'),
            'f' => Escaped::Char('\u{c}'),
            'v' => Escaped::Char('\u{b}'),
            'x' => {
                let hex: String = [self.next()?, self.next()?].iter().collect();
                let cp = u32::from_str_radix(&hex, 16).map_err(|_| format!("bad escape \\x{hex}"))?;
                Escaped::Char(char::from_u32(cp).ok_or("bad escape")?)
            }
            c if c.is_ascii_alphanumeric() => return Err(format!("unsupported escape \\{c}")),
            c => Escaped::Char(c),
        })
    }
}

enum Escaped {
    Atom(Atom),
    Char(char),
}

/// Under `(?i)`, letter subcategories would change meaning (`\p{Lu}` would match lower case).
fn case_safe(atom: &Atom) -> Result<(), String> {
    match atom {
        Atom::Props(bits, _) if bits & (unicode::UPPER | unicode::LOWER | unicode::TITLE) != 0 => {
            Err("case-insensitive letter subcategories are not supported".into())
        }
        _ => Ok(()),
    }
}

/// The characters a literal matches. Case-insensitive matching is supported for ASCII only, with
/// the two non-ASCII simple case folds into ASCII letters (U+017F 'ſ' ~ 's', U+212A 'K' ~ 'k').
fn literal(c: char, icase: bool) -> Result<Vec<Atom>, String> {
    let one = |c: char| Atom::Range(c as u32, c as u32);
    if !icase || !c.is_alphabetic() {
        return Ok(vec![one(c)]);
    }
    if !c.is_ascii() {
        return Err(format!("case-insensitive non-ASCII literal {c:?}"));
    }
    let mut atoms = vec![one(c.to_ascii_lowercase()), one(c.to_ascii_uppercase())];
    match c.to_ascii_lowercase() {
        's' => atoms.push(one('\u{17F}')),
        'k' => atoms.push(one('\u{212A}')),
        _ => {}
    }
    Ok(atoms)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use tokenizers::utils::SysRegex;

    pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const DEEPSEEK: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
    const CJK: &str = "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+";

    fn ours(pattern: &str, text: &str) -> Vec<(usize, usize)> {
        let p = Pattern::parse(pattern, Dialect::Oniguruma).unwrap();
        let mut out = Vec::new();
        p.find_iter(text, |s, e| out.push((s, e)));
        out
    }

    fn onig(pattern: &str, text: &str) -> Vec<(usize, usize)> {
        SysRegex::new(pattern).unwrap().find_iter(text).collect()
    }

    /// Deterministic text mixing the character kinds the patterns distinguish.
    pub fn random_text(seed: u64, len: usize) -> String {
        const PIECES: &[&str] = &[
            " ",
            "  ",
            "\n",
            "\r\n",
            "\t",
            "\u{a0}",
            "\u{3000}",
            "a",
            "Z",
            "word",
            "'s",
            "'LL",
            "'ſ",
            "'t",
            "'",
            "1",
            "23",
            "4567",
            "٣",
            "½",
            "é",
            "e\u{301}",
            "ß",
            "中文",
            "ひら",
            "カタ",
            "한",
            "😀",
            "👍🏽",
            "!",
            "?!",
            "...",
            "-",
            "_",
            "#",
            "$",
            "{",
            "}",
            "<|",
            "|>",
            "\u{200b}",
            "\u{1c}",
            "Ж",
            "ﬁ",
            "\u{10FFFF}",
            "\u{e000}",
            "x\u{308}",
            "\\",
            "\"",
            "€",
            "→",
            "¿",
            "“",
            "·",
        ];
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut text = String::new();
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            text.push_str(PIECES[(state % PIECES.len() as u64) as usize]);
        }
        text
    }

    #[test]
    fn matches_oniguruma_on_real_patterns() {
        for pattern in [
            LLAMA3,
            DEEPSEEK,
            CJK,
            r"\p{N}{1,3}",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        ] {
            for seed in 0..300 {
                let text = random_text(seed, 1 + (seed as usize % 40));
                assert_eq!(ours(pattern, &text), onig(pattern, &text), "{pattern:?} on {text:?}");
            }
        }
    }

    #[test]
    fn whitespace_before_words_backtracks() {
        // `\s+(?!\S)` gives back the last space so that it joins the next word.
        assert_eq!(ours(LLAMA3, "a   b"), vec![(0, 1), (1, 3), (3, 5)]);
    }

    #[test]
    fn fancy_dialect_possessive_and_end() {
        let cl100k = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
        let p = Pattern::parse(cl100k, Dialect::Fancy).unwrap();
        let mut out = Vec::new();
        p.find_iter("12345 ab  \n", |s, e| out.push((s, e)));
        assert_eq!(out, vec![(0, 3), (3, 5), (5, 8), (8, 11)]);
        assert!(Pattern::parse(cl100k, Dialect::Oniguruma).is_err());
    }

    #[test]
    fn refuses_what_it_cannot_match_exactly() {
        for bad in [r"a*?", r"\d+", r"\w", r".", r"(?i:\p{Lu})", r"(ab)+", r"^a", r"(?<x>a)"] {
            assert!(Pattern::parse(bad, Dialect::Oniguruma).is_err(), "{bad}");
        }
    }
}

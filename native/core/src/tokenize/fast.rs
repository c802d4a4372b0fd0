//! The fast encoder: added tokens, pre-tokenizer splits and byte-level BPE, nothing else.
//!
//! Built from a `tokenizer.json` only when every stage it declares is one this module reproduces
//! exactly (identity normalizer, `Split` patterns in the supported subset with `Isolated`
//! behaviour, `ByteLevel` without prefix space, BPE without dropout or affixes, added tokens without
//! strip flags); otherwise `build` says why and the caller uses the `tokenizers` crate. Also built
//! from tiktoken rank files, which have no other path.

use serde_json::Value as Json;

use super::added::{AddedToken, AddedTokens, Piece};
use super::bpe::Bpe;
use super::hash::FastMap;
use super::pattern::{Dialect, Pattern};

/// The pattern `ByteLevel { use_regex: true }` splits with (GPT-2's).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

pub struct FastTokenizer {
    added: AddedTokens,
    splits: Vec<Pattern>,
    bpe: Bpe,
    /// What each id decodes to, by id; `None` for ids the tokenizer does not know.
    token_bytes: Vec<Option<Box<[u8]>>>,
    /// Ids dropped by `skip_special_tokens`.
    special: Vec<bool>,
    /// Decoding is "concatenate the bytes, then UTF-8 with replacement" (the `ByteLevel` decoder).
    pub byte_decoder: bool,
}

/// GPT-2's reversible byte ↔ printable character map: bytes that are printable stay themselves,
/// the others are moved to U+0100 onwards.
fn byte_level_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("valid")
        };
    }
    table
}

/// `Ġhello` → `b" hello"`; `None` if a character is outside the byte-level alphabet.
fn byte_level_bytes(token: &str, inverse: &FastMap<char, u8>) -> Option<Vec<u8>> {
    token.chars().map(|c| inverse.get(&c).copied()).collect()
}

fn flag(value: &Json, key: &str) -> bool {
    value.get(key).and_then(Json::as_bool).unwrap_or(false)
}

fn is_unset(value: Option<&Json>) -> bool {
    match value {
        None | Some(Json::Null) => true,
        Some(Json::String(s)) => s.is_empty(),
        _ => false,
    }
}

impl FastTokenizer {
    /// The fast encoder for a parsed `tokenizer.json`, or why it cannot reproduce it exactly.
    pub fn from_tokenizer_json(json: &Json) -> Result<Self, String> {
        match json.get("normalizer") {
            None | Some(Json::Null) => {}
            Some(n) if n["type"] == "Sequence" && n["normalizers"].as_array().is_some_and(Vec::is_empty) => {}
            Some(n) => return Err(format!("normalizer {}", n["type"])),
        }
        for key in ["truncation", "padding"] {
            if !is_unset(json.get(key)) {
                return Err(format!("{key} is configured"));
            }
        }
        let splits = pre_tokenizer_splits(&json["pre_tokenizer"])?;
        let model = &json["model"];
        if model["type"] != "BPE" {
            return Err(format!("model {}", model["type"]));
        }
        if !(is_unset(model.get("dropout")) || model["dropout"].as_f64() == Some(0.0)) {
            return Err("BPE dropout".into());
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if !is_unset(model.get(key)) {
                return Err(format!("BPE {key}"));
            }
        }
        if flag(model, "byte_fallback") {
            return Err("BPE byte_fallback".into());
        }
        let vocab = model["vocab"].as_object().ok_or("BPE without a vocab")?;
        let chars = byte_level_chars();
        let inverse: FastMap<char, u8> = chars.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let mut by_bytes: FastMap<Box<[u8]>, u32> = FastMap::default();
        let mut token_bytes: Vec<Option<Box<[u8]>>> = Vec::new();
        let set = |id: u32, bytes: Box<[u8]>, token_bytes: &mut Vec<Option<Box<[u8]>>>| {
            if token_bytes.len() <= id as usize {
                token_bytes.resize(id as usize + 1, None);
            }
            token_bytes[id as usize] = Some(bytes);
        };
        for (token, id) in vocab {
            let id = id.as_u64().ok_or("vocab id is not a number")? as u32;
            match byte_level_bytes(token, &inverse) {
                Some(bytes) => {
                    by_bytes.insert(bytes.clone().into(), id);
                    set(id, bytes.into(), &mut token_bytes);
                }
                // Not reachable from bytes; decodes to its own UTF-8, as the ByteLevel decoder does.
                None => set(id, token.as_bytes().into(), &mut token_bytes),
            }
        }
        let id_of = |token: &str| -> Result<u32, String> {
            vocab
                .get(token)
                .and_then(Json::as_u64)
                .map(|id| id as u32)
                .ok_or(format!("merge of unknown token {token:?}"))
        };
        let mut merges = Vec::new();
        for merge in model["merges"].as_array().ok_or("BPE without merges")? {
            let (left, right) = match merge {
                Json::String(s) => s.split_once(' ').ok_or(format!("bad merge {s:?}"))?,
                Json::Array(pair) if pair.len() == 2 => (
                    pair[0].as_str().ok_or("bad merge")?,
                    pair[1].as_str().ok_or("bad merge")?,
                ),
                other => return Err(format!("bad merge {other}")),
            };
            merges.push((id_of(left)?, id_of(right)?));
        }
        let bpe = Bpe::new(by_bytes, merges, flag(model, "ignore_merges"))?;

        let mut added = Vec::new();
        let mut special = vec![false; token_bytes.len()];
        for token in json["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
            if flag(token, "lstrip") || flag(token, "rstrip") || flag(token, "single_word") {
                return Err("added token with lstrip/rstrip/single_word".into());
            }
            let content = token["content"].as_str().ok_or("added token without content")?;
            let id = token["id"].as_u64().ok_or("added token without id")? as u32;
            added.push(AddedToken {
                content,
                id,
                normalized: flag(token, "normalized"),
            });
            // The ByteLevel decoder maps an added token's characters back to bytes when all of them
            // are byte-level characters, and keeps its UTF-8 otherwise.
            let bytes = byte_level_bytes(content, &inverse).unwrap_or_else(|| content.as_bytes().to_vec());
            set(id, bytes.into(), &mut token_bytes);
            special.resize(token_bytes.len(), false);
        }
        // `skip_special_tokens` compares token strings with the special tokens' contents.
        let special_contents: Vec<&str> = json["added_tokens"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|t| flag(t, "special"))
            .filter_map(|t| t["content"].as_str())
            .collect();
        let mut token_strings: FastMap<u32, &str> = vocab
            .iter()
            .filter_map(|(t, id)| Some((id.as_u64()? as u32, t.as_str())))
            .collect();
        for token in &added {
            token_strings.insert(token.id, token.content);
        }
        for (&id, &string) in &token_strings {
            if special_contents.contains(&string) {
                special[id as usize] = true;
            }
        }
        let byte_decoder = json["decoder"]["type"] == "ByteLevel";
        Ok(FastTokenizer {
            added: AddedTokens::new(&added),
            splits,
            bpe,
            token_bytes,
            special,
            byte_decoder,
        })
    }

    /// A tiktoken encoding: `ranks` maps token bytes to ids; `pattern` in tiktoken's regex syntax;
    /// `specials` are matched like added tokens.
    pub fn from_tiktoken(
        ranks: FastMap<Box<[u8]>, u32>,
        pattern: &str,
        specials: &[(String, u32)],
    ) -> Result<Self, String> {
        let splits = vec![Pattern::parse(pattern, Dialect::Fancy)?];
        let mut token_bytes: Vec<Option<Box<[u8]>>> = Vec::new();
        for (bytes, &id) in &ranks {
            if token_bytes.len() <= id as usize {
                token_bytes.resize(id as usize + 1, None);
            }
            token_bytes[id as usize] = Some(bytes.clone());
        }
        for (content, id) in specials {
            if token_bytes.len() <= *id as usize {
                token_bytes.resize(*id as usize + 1, None);
            }
            token_bytes[*id as usize] = Some(content.as_bytes().into());
        }
        let mut special = vec![false; token_bytes.len()];
        for (_, id) in specials {
            special[*id as usize] = true;
        }
        let added: Vec<AddedToken> = specials
            .iter()
            .map(|(content, id)| AddedToken {
                content,
                id: *id,
                normalized: false,
            })
            .collect();
        Ok(FastTokenizer {
            added: AddedTokens::new(&added),
            splits,
            bpe: Bpe::from_ranks(ranks)?,
            token_bytes,
            special,
            byte_decoder: true,
        })
    }

    /// The added tokens and the text between them, in order.
    #[inline]
    pub fn split(&self, text: &str, f: &mut impl FnMut(Piece)) {
        self.added.split(text, f)
    }

    /// Ids of text that contains no added token.
    pub fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        self.pre_tokenize(text, 0, &mut |piece: &str| self.bpe.encode_piece(piece.as_bytes(), out));
    }

    fn pre_tokenize(&self, text: &str, level: usize, f: &mut impl FnMut(&str)) {
        let Some(pattern) = self.splits.get(level) else {
            if !text.is_empty() {
                f(text);
            }
            return;
        };
        let mut prev = 0;
        pattern.find_iter(text, |start, end| {
            if prev < start {
                self.pre_tokenize(&text[prev..start], level + 1, f);
            }
            self.pre_tokenize(&text[start..end], level + 1, f);
            prev = end;
        });
        if prev < text.len() {
            self.pre_tokenize(&text[prev..], level + 1, f);
        }
    }

    /// Everything: added tokens and the text between them.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        self.split(text, &mut |piece| match piece {
            Piece::Text(range) => self.encode_text(&text[range], out),
            Piece::Token(id, _) => out.push(id),
        });
    }

    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).and_then(Option::as_deref)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// A tiktoken id as its byte-level spelling ("Ġhello"); special tokens as they are.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        let bytes = self.token_bytes(id)?;
        if self.is_special(id) {
            return Some(String::from_utf8_lossy(bytes).into_owned());
        }
        let chars = byte_level_chars();
        Some(bytes.iter().map(|&b| chars[b as usize]).collect())
    }

    pub fn id_of_bytes(&self, bytes: &[u8]) -> Option<u32> {
        self.bpe.token_id(bytes)
    }

    pub fn max_id(&self) -> usize {
        self.token_bytes.len()
    }

    /// The bytes of `ids` concatenated (special ones dropped if asked); `decode` is their UTF-8.
    pub fn decode_bytes(&self, ids: &[u32], skip_special_tokens: bool, out: &mut Vec<u8>) {
        for &id in ids {
            if skip_special_tokens && self.is_special(id) {
                continue;
            }
            if let Some(bytes) = self.token_bytes(id) {
                out.extend_from_slice(bytes);
            }
        }
    }
}

/// The `Split` patterns of a pre-tokenizer, in application order (each splits the pieces of the
/// previous one); a final `ByteLevel` adds GPT-2's pattern when it uses its regex.
fn pre_tokenizer_splits(pre: &Json) -> Result<Vec<Pattern>, String> {
    let steps: Vec<&Json> = match pre["type"].as_str() {
        Some("Sequence") => pre["pretokenizers"].as_array().ok_or("bad Sequence")?.iter().collect(),
        Some(_) => vec![pre],
        None => return Err("no pre-tokenizer".into()),
    };
    let (last, splits) = steps.split_last().ok_or("empty pre-tokenizer")?;
    if last["type"] != "ByteLevel" || flag(last, "add_prefix_space") {
        return Err("the pre-tokenizer does not end with ByteLevel(add_prefix_space=false)".into());
    }
    let mut patterns = Vec::new();
    for split in splits {
        if split["type"] != "Split" || split["behavior"] != "Isolated" || flag(split, "invert") {
            return Err(format!("pre-tokenizer {} {}", split["type"], split["behavior"]));
        }
        let regex = split["pattern"]["Regex"]
            .as_str()
            .ok_or("Split without a Regex pattern")?;
        patterns.push(Pattern::parse(regex, Dialect::Oniguruma)?);
    }
    if last.get("use_regex").and_then(Json::as_bool).unwrap_or(true) {
        patterns.push(Pattern::parse(GPT2_PATTERN, Dialect::Oniguruma)?);
    }
    Ok(patterns)
}

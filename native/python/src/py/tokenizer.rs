//! `Tokenizer` and `ChatTemplate`: the native tokenizer, templates and detokenizer, for tests and
//! benchmarks. Inputs are copied into Rust values, then the work runs with the GIL released; JSON
//! arguments are strings so no Python object is walked.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value as Json};

use extproc_core::detokenize::IncrementalDecoder;
use extproc_core::model::ModelFiles;
use extproc_core::template::{ChatInputs, ChatTemplate, RenderError};
use extproc_core::tokenize::TextTokenizer;

#[pyclass(name = "Tokenizer", module = "extproc._native", frozen)]
pub struct PyTokenizer {
    files: Arc<ModelFiles>,
}

/// `continue_final_message`: a flag or the name of the field to continue.
#[derive(FromPyObject)]
enum Continue {
    Flag(bool),
    Field(String),
}

/// The chat-template arguments, parsed.
struct ChatArgs {
    messages: Vec<Json>,
    tools: Option<Json>,
    documents: Option<Json>,
    kwargs: Map<String, Json>,
    add_generation_prompt: bool,
    continue_field: Option<String>,
}

impl ChatArgs {
    fn parse(
        messages_json: &str,
        tools_json: Option<&str>,
        documents_json: Option<&str>,
        kwargs_json: Option<&str>,
        add_generation_prompt: bool,
        continue_final_message: Option<Continue>,
    ) -> PyResult<Self> {
        let parse = |what: &str, text: &str| -> PyResult<Json> {
            serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
        };
        let Json::Array(messages) = parse("messages_json", messages_json)? else {
            return Err(PyValueError::new_err("messages_json must be a JSON array"));
        };
        let kwargs = match kwargs_json.map(|k| parse("chat_template_kwargs_json", k)).transpose()? {
            None => Map::new(),
            Some(Json::Object(map)) => map,
            Some(_) => return Err(PyValueError::new_err("chat_template_kwargs_json must be a JSON object")),
        };
        let continue_field = match continue_final_message {
            None | Some(Continue::Flag(false)) => None,
            Some(Continue::Flag(true)) => Some("content".to_string()),
            Some(Continue::Field(field)) => Some(field),
        };
        Ok(ChatArgs {
            messages,
            tools: tools_json.map(|t| parse("tools_json", t)).transpose()?,
            documents: documents_json.map(|d| parse("documents_json", d)).transpose()?,
            kwargs,
            add_generation_prompt,
            continue_field,
        })
    }

    fn inputs(&self) -> ChatInputs<'_> {
        ChatInputs {
            messages: &self.messages,
            tools: self.tools.as_ref(),
            documents: self.documents.as_ref(),
            add_generation_prompt: self.add_generation_prompt,
            continue_final_message: self.continue_field.as_deref(),
            special_tokens: None,
            kwargs: Some(&self.kwargs),
        }
    }
}

fn render_error(e: RenderError) -> PyErr {
    match e {
        RenderError::Raised(message) | RenderError::Invalid { message, .. } => PyValueError::new_err(message),
        RenderError::Failed(message) => PyRuntimeError::new_err(message),
    }
}

fn bare(tokenizer: TextTokenizer) -> ModelFiles {
    ModelFiles {
        tokenizer,
        template: None,
        named_templates: Default::default(),
        bos_token: None,
        eos_token: None,
        eos_token_ids: Vec::new(),
        max_context: None,
        add_bos_token: false,
        special_tokens: Map::new(),
    }
}

impl PyTokenizer {
    fn render(&self, py: Python<'_>, args: ChatArgs, template_name: Option<String>) -> PyResult<String> {
        let files = self.files.clone();
        py.detach(move || files.render_chat(template_name.as_deref(), args.inputs()))
            .map_err(render_error)
    }

    fn render_and_encode(&self, py: Python<'_>, args: ChatArgs, name: Option<String>) -> PyResult<Arc<[u32]>> {
        let files = self.files.clone();
        py.detach(move || {
            let text = files
                .render_chat(name.as_deref(), args.inputs())
                .map_err(render_error)?;
            files.tokenizer.encode_shared(&text).map_err(PyRuntimeError::new_err)
        })
    }
}

#[pymethods]
impl PyTokenizer {
    /// A Hugging Face style model directory (tokenizer, configs, chat templates).
    #[staticmethod]
    fn from_model_dir(py: Python<'_>, model_dir: PathBuf) -> PyResult<Self> {
        let files = py
            .detach(move || ModelFiles::load(&model_dir))
            .map_err(PyValueError::new_err)?;
        Ok(PyTokenizer { files: Arc::new(files) })
    }

    /// A bare `tokenizer.json` (no templates).
    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let tokenizer = py
            .detach(move || TextTokenizer::from_file(&path))
            .map_err(PyValueError::new_err)?;
        Ok(PyTokenizer {
            files: Arc::new(bare(tokenizer)),
        })
    }

    /// A tiktoken rank file; `pattern` and `special_tokens` unless its name is a known encoding.
    #[staticmethod]
    #[pyo3(signature = (path, pattern = None, special_tokens = None))]
    fn from_tiktoken(
        py: Python<'_>,
        path: PathBuf,
        pattern: Option<String>,
        special_tokens: Option<Vec<(String, u32)>>,
    ) -> PyResult<Self> {
        let tokenizer = py
            .detach(move || {
                let specials = special_tokens.unwrap_or_default();
                let encoding = pattern.as_deref().map(|p| (p, specials.as_slice()));
                TextTokenizer::from_tiktoken(&path, encoding)
            })
            .map_err(PyValueError::new_err)?;
        Ok(PyTokenizer {
            files: Arc::new(bare(tokenizer)),
        })
    }

    /// None when the fast encoder is in use, else why it is not.
    #[getter]
    fn fast_path_refusal(&self) -> Option<String> {
        self.files.tokenizer.fast_path().err().map(str::to_string)
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.files.tokenizer.vocab_size()
    }

    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.files.eos_token_ids.clone()
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.files.tokenizer.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.files.tokenizer.id_to_token(id)
    }

    /// Token ids (no special tokens added), through the token cache.
    fn encode(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        let files = self.files.clone();
        py.detach(move || files.tokenizer.encode(&text))
            .map_err(PyRuntimeError::new_err)
    }

    /// Token ids without the token cache.
    fn encode_uncached(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        let files = self.files.clone();
        py.detach(move || files.tokenizer.encode_uncached(&text))
            .map_err(PyRuntimeError::new_err)
    }

    /// The number of tokens, through the cache: encoding without building any Python int.
    #[pyo3(signature = (text, *, cached = true))]
    fn count_tokens(&self, py: Python<'_>, text: String, cached: bool) -> PyResult<usize> {
        let files = self.files.clone();
        py.detach(move || {
            if cached {
                files.tokenizer.encode_shared(&text).map(|ids| ids.len())
            } else {
                files.tokenizer.encode_uncached(&text).map(|ids| ids.len())
            }
        })
        .map_err(PyRuntimeError::new_err)
    }

    #[pyo3(signature = (ids, skip_special_tokens = false))]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> String {
        let files = self.files.clone();
        py.detach(move || files.tokenizer.decode(&ids, skip_special_tokens))
    }

    /// Stream `ids` through the incremental detokenizer in pieces of `chunk_sizes` (cycled); returns
    /// each push's delta, then the flush's.
    #[pyo3(signature = (ids, chunk_sizes, skip_special_tokens = false, stop = None))]
    fn decode_stream(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        chunk_sizes: Vec<usize>,
        skip_special_tokens: bool,
        stop: Option<Vec<String>>,
    ) -> PyResult<Vec<String>> {
        if chunk_sizes.is_empty() || chunk_sizes.contains(&0) {
            return Err(PyValueError::new_err("chunk_sizes must be positive"));
        }
        let files = self.files.clone();
        Ok(py.detach(move || {
            let tokenizer = &files.tokenizer;
            let mut decoder = match stop {
                Some(stops) => IncrementalDecoder::with_stop_strings(skip_special_tokens, stops),
                None => IncrementalDecoder::new(skip_special_tokens),
            };
            let mut deltas = Vec::new();
            let (mut at, mut sizes) = (0, chunk_sizes.iter().cycle());
            while at < ids.len() {
                let end = (at + sizes.next().expect("cycled")).min(ids.len());
                deltas.push(decoder.push(tokenizer, &ids[at..end]));
                at = end;
            }
            deltas.push(decoder.flush(tokenizer));
            deltas
        }))
    }

    /// `apply_chat_template(messages, tokenize=False, ...)`; ValueError when the template raises.
    #[pyo3(signature = (messages_json, *, tools_json = None, documents_json = None, add_generation_prompt = false,
        continue_final_message = None, chat_template_kwargs_json = None, template_name = None))]
    #[allow(clippy::too_many_arguments)]
    fn render_chat(
        &self,
        py: Python<'_>,
        messages_json: &str,
        tools_json: Option<&str>,
        documents_json: Option<&str>,
        add_generation_prompt: bool,
        continue_final_message: Option<Continue>,
        chat_template_kwargs_json: Option<&str>,
        template_name: Option<String>,
    ) -> PyResult<String> {
        let args = ChatArgs::parse(
            messages_json,
            tools_json,
            documents_json,
            chat_template_kwargs_json,
            add_generation_prompt,
            continue_final_message,
        )?;
        self.render(py, args, template_name)
    }

    /// `apply_chat_template(messages, tokenize=True, ...)`: template, then tokenize (cached).
    #[pyo3(signature = (messages_json, *, tools_json = None, documents_json = None, add_generation_prompt = false,
        continue_final_message = None, chat_template_kwargs_json = None, template_name = None))]
    #[allow(clippy::too_many_arguments)]
    fn chat_ids(
        &self,
        py: Python<'_>,
        messages_json: &str,
        tools_json: Option<&str>,
        documents_json: Option<&str>,
        add_generation_prompt: bool,
        continue_final_message: Option<Continue>,
        chat_template_kwargs_json: Option<&str>,
        template_name: Option<String>,
    ) -> PyResult<Vec<u32>> {
        let args = ChatArgs::parse(
            messages_json,
            tools_json,
            documents_json,
            chat_template_kwargs_json,
            add_generation_prompt,
            continue_final_message,
        )?;
        Ok(self.render_and_encode(py, args, template_name)?.to_vec())
    }

    /// The prompt length of a chat: the gateway's request path (template + tokenize) without
    /// handing ids to Python, for benchmarks.
    #[pyo3(signature = (messages_json, *, add_generation_prompt = true))]
    fn chat_prompt_len(&self, py: Python<'_>, messages_json: &str, add_generation_prompt: bool) -> PyResult<usize> {
        let args = ChatArgs::parse(messages_json, None, None, None, add_generation_prompt, None)?;
        Ok(self.render_and_encode(py, args, None)?.len())
    }

    /// Token cache counters: l0_hits, l0_misses, l1_hits, l1_misses, l1_reused_ids,
    /// tokenized_bytes, entries, bytes.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.files.tokenizer.cache_stats();
        let d = PyDict::new(py);
        d.set_item("l0_hits", s.l0_hits)?;
        d.set_item("l0_misses", s.l0_misses)?;
        d.set_item("l1_hits", s.l1_hits)?;
        d.set_item("l1_misses", s.l1_misses)?;
        d.set_item("l1_reused_ids", s.l1_reused_ids)?;
        d.set_item("tokenized_bytes", s.tokenized_bytes)?;
        d.set_item("entries", s.entries)?;
        d.set_item("bytes", s.bytes)?;
        Ok(d)
    }

    fn clear_cache(&self) {
        self.files.tokenizer.clear_cache();
    }

    /// Bound the token cache; `max_entries=0` turns it off.
    fn set_cache_limits(&self, max_entries: usize, max_bytes: usize) {
        self.files.tokenizer.set_cache_limits(max_entries, max_bytes);
    }
}

/// A chat template on its own, compiled once.
#[pyclass(name = "ChatTemplate", module = "extproc._native", frozen)]
pub struct PyChatTemplate {
    inner: Arc<ChatTemplate>,
}

#[pymethods]
impl PyChatTemplate {
    #[new]
    fn new(source: &str) -> PyResult<Self> {
        Ok(PyChatTemplate {
            inner: Arc::new(ChatTemplate::compile(source).map_err(PyValueError::new_err)?),
        })
    }

    /// Render with a JSON object as the whole context (no HF preprocessing).
    fn render(&self, py: Python<'_>, context_json: &str) -> PyResult<String> {
        let context: Json = serde_json::from_str(context_json).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let inner = self.inner.clone();
        py.detach(move || inner.render_json(&context)).map_err(render_error)
    }

    /// `apply_chat_template(..., tokenize=False)` semantics; `special_tokens_json` holds bos_token etc.
    #[pyo3(signature = (messages_json, *, tools_json = None, documents_json = None, add_generation_prompt = false,
        continue_final_message = None, chat_template_kwargs_json = None, special_tokens_json = None))]
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        py: Python<'_>,
        messages_json: &str,
        tools_json: Option<&str>,
        documents_json: Option<&str>,
        add_generation_prompt: bool,
        continue_final_message: Option<Continue>,
        chat_template_kwargs_json: Option<&str>,
        special_tokens_json: Option<&str>,
    ) -> PyResult<String> {
        let args = ChatArgs::parse(
            messages_json,
            tools_json,
            documents_json,
            chat_template_kwargs_json,
            add_generation_prompt,
            continue_final_message,
        )?;
        let specials: Map<String, Json> = match special_tokens_json {
            Some(text) => serde_json::from_str(text).map_err(|e| PyValueError::new_err(e.to_string()))?,
            None => Map::new(),
        };
        let inner = self.inner.clone();
        py.detach(move || {
            inner.apply(&ChatInputs {
                special_tokens: Some(&specials),
                ..args.inputs()
            })
        })
        .map_err(render_error)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyChatTemplate>()?;
    Ok(())
}

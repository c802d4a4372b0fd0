//! The models the response filter serves: each served model's files (its tokenizer above all), loaded
//! once from the same model directories extproc serves them from, when Envoy loads the filter config.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use extproc_core::model::ModelFiles;
use extproc_core::stream::output_plan::non_marker_special_ids;
use serde::Deserialize;

/// The filter config (JSON): `{"models": {"<served name>": "<model directory>", ...}, "stream_flush_ms": N,
/// "stop_file": "<path>"}`.
#[derive(Deserialize)]
struct Config {
    models: HashMap<String, String>,
    /// How long a stream's bytes after its first content may be held to go out together (0: each engine
    /// message's bytes go out at once).
    #[serde(default)]
    stream_flush_ms: u64,
    /// A file extproc creates when its shutdown grace ran out: open answers then end as on the ext_proc
    /// path (an SSE error event and `data: [DONE]`, or a 503).
    #[serde(default)]
    stop_file: Option<String>,
}

/// The response filter's config: the served models and how streams are flushed.
pub struct ResponseConfig {
    pub models: Models,
    /// Zero: no holding.
    pub stream_flush: Duration,
}

impl ResponseConfig {
    pub fn from_json(json: &[u8]) -> Result<ResponseConfig, String> {
        let config: Config = serde_json::from_slice(json).map_err(|e| format!("bad filter config: {e}"))?;
        if let Some(path) = config.stop_file.filter(|p| !p.is_empty()) {
            crate::watchdog::watch_stop_file(path.into());
        }
        Ok(ResponseConfig {
            models: Models::load(config.models)?,
            stream_flush: Duration::from_millis(config.stream_flush_ms),
        })
    }
}

pub struct Model {
    pub files: Arc<ModelFiles>,
    /// The special tokens parsed answers drop (computed on the first parsed answer: it reads the whole
    /// vocabulary).
    dropped: OnceLock<Arc<HashSet<u32>>>,
}

impl Model {
    pub fn dropped_special_ids(&self) -> Arc<HashSet<u32>> {
        self.dropped
            .get_or_init(|| Arc::new(non_marker_special_ids(&self.files)))
            .clone()
    }
}

pub struct Models(HashMap<String, Model>);

impl Models {
    fn load(dirs: HashMap<String, String>) -> Result<Models, String> {
        let mut models = HashMap::new();
        for (name, dir) in dirs {
            let files = ModelFiles::load(Path::new(&dir)).map_err(|e| format!("model '{name}' in {dir}: {e}"))?;
            let model = Model {
                files: Arc::new(files),
                dropped: OnceLock::new(),
            };
            models.insert(name, model);
        }
        Ok(Models(models))
    }

    pub fn get(&self, name: &str) -> Option<&Model> {
        self.0.get(name)
    }
}

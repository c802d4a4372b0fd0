//! The models the response filter serves: each served model's files (its tokenizer above all), loaded
//! once from the same model directories extproc serves them from, when Envoy loads the filter config.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use extproc_core::model::ModelFiles;
use extproc_core::stream::output_plan::non_marker_special_ids;
use serde::Deserialize;

/// The filter config (JSON): `{"models": {"<served name>": "<model directory>", ...}}`.
#[derive(Deserialize)]
struct Config {
    models: HashMap<String, String>,
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
    pub fn from_config(json: &[u8]) -> Result<Models, String> {
        let config: Config = serde_json::from_slice(json).map_err(|e| format!("bad filter config: {e}"))?;
        let mut models = HashMap::new();
        for (name, dir) in config.models {
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

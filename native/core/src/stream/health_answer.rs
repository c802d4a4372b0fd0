//! `GET /health` on the client port, answered by the gateway itself from the router's view of the
//! engines (no engine is called): 200 `{"status": "ok", "models": {...}}` when every served model has a
//! ready engine, else 503 with the reason. A load balancer's probe carries no API key, so the answer
//! needs none; with keys configured, only a valid key sees model names (those it may use).

use std::sync::Arc;

use serde_json::{json, Map};

use crate::auth::Grant;
use crate::gateway::Gateway;
use crate::health::{self, ModelHealth};

/// Who asks: with no keys configured anyone sees every model; with keys, a valid key sees the models
/// it may use, and a request without one sees none.
pub(super) enum Viewer {
    Anyone,
    Key(Arc<Grant>),
    Unknown,
}

impl Viewer {
    fn sees(&self, model: &str) -> bool {
        match self {
            Viewer::Anyone => true,
            Viewer::Key(grant) => grant.allows(model),
            Viewer::Unknown => false,
        }
    }
}

/// The status code and JSON body of the answer.
pub(super) fn answer(gateway: &Gateway, viewer: &Viewer) -> (u16, Vec<u8>) {
    let all = health::models(gateway);
    let shown: Vec<&ModelHealth> = all.iter().filter(|m| viewer.sees(&m.name)).collect();
    let mut models = Map::new();
    for m in &shown {
        models.insert(
            m.name.clone(),
            json!({"ready_engines": m.ready_engines, "engines": m.engines}),
        );
    }
    let (status, body) = match health::readiness(&all) {
        Ok(()) => (200, json!({"status": "ok", "models": models})),
        Err(reason) => {
            // Name only models the viewer may see.
            let named = all
                .iter()
                .filter(|m| m.ready_engines == 0)
                .all(|m| viewer.sees(&m.name));
            let reason = if named || all.is_empty() {
                reason
            } else {
                "a served model has no ready engine".to_string()
            };
            (
                503,
                json!({"status": "unavailable", "reason": reason, "models": models}),
            )
        }
    };
    (status, body.to_string().into_bytes())
}

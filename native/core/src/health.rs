//! Whether the gateway can serve: per served model, how many of its engines are ready (healthy in the
//! router). Read by the gRPC health service (`server/health.rs`, GIE's `readiness`) and by
//! `GET /health` on the client port (`stream/health_answer.rs`); neither calls an engine.

use std::collections::BTreeSet;

use crate::gateway::Gateway;
use crate::routing::endpoint::split_name;

/// One served model's engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelHealth {
    pub name: String,
    /// Engines with at least one healthy endpoint (a data-parallel engine counts once).
    pub ready_engines: usize,
    /// Engines the control plane registered.
    pub engines: usize,
}

/// Every served model's engines, sorted by model name.
pub fn models(gateway: &Gateway) -> Vec<ModelHealth> {
    gateway
        .models()
        .iter()
        .map(|m| {
            let ready: BTreeSet<String> = m
                .ready_endpoints()
                .iter()
                .map(|e| split_name(e).0.to_string())
                .collect();
            ModelHealth {
                name: m.name.clone(),
                ready_engines: ready.len(),
                engines: m.protocols().len(),
            }
        })
        .collect()
}

/// Ready when there is a model and every model has a ready engine; else the reason.
pub fn readiness(models: &[ModelHealth]) -> Result<(), String> {
    if models.is_empty() {
        return Err("no model is served".into());
    }
    let waiting: Vec<&str> = models
        .iter()
        .filter(|m| m.ready_engines == 0)
        .map(|m| m.name.as_str())
        .collect();
    match waiting.as_slice() {
        [] => Ok(()),
        [one] => Err(format!("model '{one}' has no ready engine")),
        many => Err(format!("models {} have no ready engine", quoted(many))),
    }
}

fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, ready: usize) -> ModelHealth {
        ModelHealth {
            name: name.into(),
            ready_engines: ready,
            engines: 2,
        }
    }

    #[test]
    fn ready_only_when_every_model_has_a_ready_engine() {
        assert_eq!(readiness(&[model("a", 1), model("b", 2)]), Ok(()));
        assert_eq!(
            readiness(&[model("a", 1), model("b", 0)]),
            Err("model 'b' has no ready engine".into())
        );
        assert_eq!(
            readiness(&[model("a", 0), model("b", 0)]),
            Err("models 'a', 'b' have no ready engine".into())
        );
        assert!(readiness(&[]).is_err());
    }
}

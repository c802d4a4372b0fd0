//! Errors of router construction and configuration (picking itself cannot fail: it answers `None`).

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoutingError {
    #[error("unknown routing policy {name:?} (known: {known})")]
    UnknownPolicy { name: String, known: String },
    #[error("unknown scorer {name:?} (known: {known})")]
    UnknownScorer { name: String, known: String },
    #[error("invalid routing config: {0}")]
    BadConfig(String),
    #[error("at most {max} endpoints per router, got {got}")]
    TooManyEndpoints { max: usize, got: usize },
}

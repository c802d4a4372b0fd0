//! Structured-output requests: the tool choice and the one decoding constraint a request may carry
//! (`response_format`, vLLM's `structured_outputs` and `guided_*` extras, or a forced tool call).

/// Which tool calls the model may or must make (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No tool call: the default when the request has no tools.
    #[default]
    None,
    /// The model decides: the default when the request has tools.
    Auto,
    /// At least one call: the output is constrained to a JSON array of calls (see `forced_tool_schema`).
    Required,
    /// Exactly one call of this function: the output is constrained to one JSON call object.
    Named(String),
}

impl ToolChoice {
    /// Whether the output is constrained to tool-call JSON rather than parsed from free text.
    pub fn is_forced(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Named(_))
    }
}

/// The one constraint on what the engine may generate, in the form both engine protocols take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// A JSON Schema, serialized (`json_object` is `{"type":"object"}`).
    JsonSchema(String),
    Regex(String),
    /// An EBNF grammar (as the engine's grammar backend reads it).
    Grammar(String),
    /// One of these strings exactly.
    Choice(Vec<String>),
    /// A structural tag, serialized JSON.
    StructuralTag(String),
}

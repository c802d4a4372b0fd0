//! JSON inputs shaped like OpenAI requests: whole requests generated from the chat and completions
//! schemas, and tree mutations of a parsed request (a field's value replaced, a field dropped or added,
//! an element repeated). Values are usually the right type with edge values (0, -1, limits and one past
//! them, huge and tiny floats, odd Unicode, template syntax) and sometimes any type at all: blind byte
//! mutations rarely get past the JSON parser, these reach the validation behind it.

use serde_json::{json, Map, Number, Value};

use crate::rng::Rng;

const EDGE_INTS: [i64; 14] = [
    0,
    1,
    -1,
    2,
    4,
    20,
    21,
    64,
    65,
    128,
    129,
    4_294_967_295,
    4_294_967_296,
    i64::MAX,
];
const EDGE_FLOATS: [f64; 10] = [0.0, -0.0, 0.5, 1.0, 1e-5, 1e-6, 2.0, 2.000_001, 1e308, -9.0e15];
const STRINGS: [&str; 14] = [
    "",
    "m",
    "Hello there",
    "é✓🙂 mixed ünïcödé",
    "\u{0}",
    "\u{fffd}\u{200b}",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "{{ messages }}",
    "{% for m in messages %}",
    "CONTINUE_FINAL_MESSAGE_TAG ",
    "\\\"'\n\t",
    "text",
    "content",
];
const ROLES: [&str; 6] = ["system", "user", "assistant", "tool", "developer", "x"];
const CHAT_FIELDS: [&str; 11] = [
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "documents",
    "tool_choice",
    "response_format",
    "parallel_tool_calls",
];
const COMMON_FIELDS: [&str; 24] = [
    "stream",
    "stream_options",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "logit_bias",
    "n",
    "user",
    "include_stop_str_in_output",
    "echo",
    "logprobs",
    "suffix",
    "best_of",
];

/// Field names as dictionary tokens for byte mutations.
pub fn field_tokens() -> Vec<&'static [u8]> {
    let mut tokens: Vec<&'static [u8]> = vec![
        b"\"model\"",
        b"\"messages\"",
        b"\"prompt\"",
        b"\"role\"",
        b"\"content\"",
        b"\"type\"",
        b"\"text\"",
        b"null",
        b"true",
        b"false",
        b"[]",
        b"{}",
        b"\\u0000",
        b"\\ud800",
        b"1e309",
        b"-0",
        b"4294967296",
        b"9007199254740993",
        b": ",
        b", ",
        // Nesting: repeated by duplication, it reaches the parsers' and renderers' depth limits.
        b"[[[[[[[[[[[[[[[[",
        b"{\"a\": {\"a\": {\"a\": {\"a\": ",
    ];
    tokens.extend(CHAT_FIELDS.iter().chain(COMMON_FIELDS.iter()).map(|f| f.as_bytes()));
    tokens
}

fn number(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => Value::from(*rng.pick(&EDGE_FLOATS)),
        1 => Value::from(rng.below(300) as i64 - 20),
        2 => Number::from_f64(rng.next_u64() as f64 / u64::MAX as f64 * 4.0 - 1.0).map_or(Value::Null, Value::Number),
        _ => {
            let n = *rng.pick(&EDGE_INTS);
            Value::from(if rng.one_in(4) { n.wrapping_neg() } else { n })
        }
    }
}

fn string(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => rng.pick(&STRINGS).repeat(1 + rng.size(64)),
        1 => {
            let n = rng.size(32);
            String::from_utf8_lossy(&rng.bytes(n)).into_owned()
        }
        _ => rng.pick(&STRINGS).to_string(),
    }
}

/// Any JSON value, nested at most `depth` levels.
pub fn any_value(rng: &mut Rng, depth: usize) -> Value {
    let kinds = if depth == 0 { 4 } else { 6 };
    match rng.below(kinds) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => number(rng),
        3 => Value::String(string(rng)),
        4 => Value::Array((0..rng.size(6)).map(|_| any_value(rng, depth - 1)).collect()),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.size(5) {
                let key = if rng.one_in(2) {
                    rng.pick(&COMMON_FIELDS).to_string()
                } else {
                    string(rng)
                };
                map.insert(key, any_value(rng, depth - 1));
            }
            Value::Object(map)
        }
    }
}

fn token_ids(rng: &mut Rng) -> Value {
    Value::Array(
        (0..1 + rng.size(16))
            .map(|_| {
                if rng.one_in(8) {
                    number(rng)
                } else {
                    Value::from(rng.below(130_000))
                }
            })
            .collect(),
    )
}

fn content(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => Value::Null,
        1 => Value::Array(
            (0..rng.size(4))
                .map(|_| match rng.below(4) {
                    0 => json!({"type": "image_url", "image_url": {"url": "data:,"}}),
                    1 => json!({"type": "text"}),
                    _ => json!({"type": "text", "text": string(rng)}),
                })
                .collect(),
        ),
        _ => Value::String(string(rng)),
    }
}

fn message(rng: &mut Rng) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), Value::from(*rng.pick(&ROLES)));
    m.insert("content".into(), content(rng));
    if rng.one_in(4) {
        let field = *rng.pick(&["reasoning_content", "thinking", "reasoning"]);
        m.insert(field.into(), Value::String(string(rng)));
    }
    if rng.one_in(5) {
        let args = if rng.one_in(2) {
            Value::String("{\"city\": \"Paris\"}".into())
        } else {
            json!({"city": string(rng)})
        };
        m.insert(
            "tool_calls".into(),
            json!([{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]),
        );
    }
    if rng.one_in(6) {
        m.insert("tool_call_id".into(), Value::from("call_1"));
        m.insert("name".into(), Value::String(string(rng)));
    }
    if rng.one_in(10) {
        m.insert(string(rng), any_value(rng, 2));
    }
    Value::Object(m)
}

fn tool(rng: &mut Rng) -> Value {
    if rng.one_in(5) {
        return any_value(rng, 3);
    }
    json!({"type": "function", "function": {
        "name": string(rng),
        "description": string(rng),
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }})
}

/// A value for the request field `name`: usually its type (with edge values), sometimes anything.
pub fn field_value(rng: &mut Rng, name: &str) -> Value {
    if rng.one_in(8) {
        return any_value(rng, 2);
    }
    match name {
        "model" => Value::from(if rng.one_in(4) { string(rng) } else { "m".into() }),
        "messages" => Value::Array((0..rng.size(6)).map(|_| message(rng)).collect()),
        "prompt" => match rng.below(4) {
            0 => token_ids(rng),
            1 => Value::Array((0..rng.size(70)).map(|_| Value::String(string(rng))).collect()),
            2 => Value::Array((0..rng.size(4)).map(|_| token_ids(rng)).collect()),
            _ => Value::String(string(rng)),
        },
        "tools" => Value::Array((0..rng.size(3)).map(|_| tool(rng)).collect()),
        "documents" => json!([{"title": string(rng), "text": string(rng)}]),
        "stream_options" => json!({"include_usage": field_value(rng, "stream")}),
        "stop" => {
            if rng.one_in(2) {
                Value::String(string(rng))
            } else {
                Value::Array((0..rng.size(5)).map(|_| Value::String(string(rng))).collect())
            }
        }
        "stop_token_ids" => token_ids(rng),
        "logit_bias" => {
            let mut map = Map::new();
            for _ in 0..rng.size(4) {
                let key = if rng.one_in(4) {
                    string(rng)
                } else {
                    (rng.below(200_000) as i64 - 10).to_string()
                };
                map.insert(key, number(rng));
            }
            Value::Object(map)
        }
        "chat_template_kwargs" => {
            let mut map = Map::new();
            for key in [
                "enable_thinking",
                "bos_token",
                "messages",
                "tools",
                "add_generation_prompt",
            ] {
                if rng.one_in(3) {
                    map.insert(key.into(), any_value(rng, 2));
                }
            }
            Value::Object(map)
        }
        "user" | "suffix" => Value::String(string(rng)),
        "stream"
        | "ignore_eos"
        | "skip_special_tokens"
        | "echo"
        | "include_stop_str_in_output"
        | "add_generation_prompt"
        | "continue_final_message"
        | "parallel_tool_calls" => {
            if rng.one_in(6) {
                Value::Null
            } else {
                Value::Bool(rng.one_in(2))
            }
        }
        "logprobs" if rng.one_in(2) => Value::Bool(rng.one_in(2)),
        _ => number(rng),
    }
}

/// A whole request: chat (`messages`) or completions (`prompt`), with a random subset of the fields.
pub fn request(rng: &mut Rng, chat: bool) -> Value {
    let mut obj = Map::new();
    if !rng.one_in(16) {
        obj.insert("model".into(), field_value(rng, "model"));
    }
    let input = if chat { "messages" } else { "prompt" };
    if !rng.one_in(16) {
        obj.insert(input.into(), field_value(rng, input));
    }
    for _ in 0..rng.size(8) {
        let name = if chat && rng.one_in(2) {
            *rng.pick(&CHAT_FIELDS)
        } else {
            *rng.pick(&COMMON_FIELDS)
        };
        obj.insert(name.into(), field_value(rng, name));
    }
    Value::Object(obj)
}

/// A request the parser accepts (the fields a client usually sends, in range): what gets past
/// validation to the template, the tokenizer and the engine.
pub fn valid_request(rng: &mut Rng, chat: bool, model: &str) -> Value {
    let mut obj = Map::new();
    obj.insert("model".into(), Value::from(model));
    if chat {
        let mut messages = Vec::new();
        if rng.one_in(3) {
            messages.push(json!({"role": "system", "content": rng.pick(&STRINGS).to_string()}));
        }
        for turn in 0..1 + 2 * rng.below(3) {
            let role = if turn % 2 == 0 { "user" } else { "assistant" };
            messages.push(json!({"role": role, "content": rng.pick(&STRINGS).to_string()}));
        }
        obj.insert("messages".into(), Value::Array(messages));
        if rng.one_in(4) {
            obj.insert("logprobs".into(), Value::Bool(true));
            obj.insert("top_logprobs".into(), Value::from(rng.below(4)));
        }
    } else {
        let prompt = match rng.below(4) {
            0 => Value::Array((0..1 + rng.below(8)).map(|_| Value::from(rng.below(256))).collect()),
            1 => Value::Array(
                (0..2 + rng.below(3))
                    .map(|_| Value::String(rng.pick(&STRINGS).to_string()))
                    .collect(),
            ),
            _ => Value::String(rng.pick(&STRINGS).to_string()),
        };
        let batched = prompt.as_array().is_some_and(|p| p[0].is_string());
        obj.insert("prompt".into(), prompt);
        if rng.one_in(4) {
            obj.insert("logprobs".into(), Value::from(rng.below(4)));
        } else if rng.one_in(6) {
            obj.insert("echo".into(), Value::Bool(true));
        }
        if batched {
            obj.insert("stream".into(), Value::Bool(false));
        }
    }
    obj.insert("max_tokens".into(), Value::from(1 + rng.below(16)));
    if !obj.contains_key("stream") && rng.one_in(2) {
        obj.insert("stream".into(), Value::Bool(true));
        if rng.one_in(2) {
            obj.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if rng.one_in(4) {
        obj.insert("n".into(), Value::from(1 + rng.below(3)));
        obj.insert("temperature".into(), Value::from(0.7));
    }
    if rng.one_in(4) {
        obj.insert("stop".into(), json!(["\n", "hi"]));
    }
    if rng.one_in(6) {
        obj.insert("user".into(), Value::from("user-1"));
    }
    Value::Object(obj)
}

/// Mutate a parsed request in place: one change somewhere in its tree.
pub fn mutate_tree(rng: &mut Rng, value: &mut Value) {
    change_below(rng, value, "");
}

/// Walks down a random path (`name`: the field holding `node`) and changes the node it stops at.
fn change_below(rng: &mut Rng, node: &mut Value, name: &str) {
    let descend = rng.below(3) != 0;
    match node {
        Value::Object(map) if descend && !map.is_empty() => {
            let key = map.keys().nth(rng.below(map.len())).cloned().expect("in range");
            return change_below(rng, map.get_mut(&key).expect("present"), &key);
        }
        Value::Array(items) if descend && !items.is_empty() => {
            let at = rng.below(items.len());
            return change_below(rng, &mut items[at], name);
        }
        _ => {}
    }
    match node {
        Value::Object(map) if rng.one_in(3) && !map.is_empty() => {
            let key = map.keys().nth(rng.below(map.len())).cloned().expect("in range");
            map.shift_remove(&key);
        }
        Value::Object(map) if rng.one_in(2) => {
            let key = if rng.one_in(2) {
                rng.pick(&COMMON_FIELDS).to_string()
            } else {
                rng.pick(&CHAT_FIELDS).to_string()
            };
            let v = field_value(rng, &key);
            map.insert(key, v);
        }
        Value::Array(items) if rng.one_in(2) && !items.is_empty() => {
            let at = rng.below(items.len());
            let copy = items[at].clone();
            for _ in 0..rng.size(80) {
                items.push(copy.clone());
            }
        }
        _ => *node = field_value(rng, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_input_field_mostly() {
        let mut rng = Rng::new(3);
        let with_messages = (0..200)
            .filter(|_| request(&mut rng, true).get("messages").is_some())
            .count();
        assert!(with_messages > 150, "{with_messages}");
    }

    #[test]
    fn tree_mutations_change_the_request() {
        let mut rng = Rng::new(5);
        let original = json!({"model": "m", "prompt": "hi", "max_tokens": 4});
        let changed = (0..50)
            .filter(|_| {
                let mut v = original.clone();
                mutate_tree(&mut rng, &mut v);
                v != original
            })
            .count();
        assert!(changed > 40, "{changed}");
    }
}

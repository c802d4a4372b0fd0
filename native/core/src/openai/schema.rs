//! A light check that a value is a JSON Schema object: the keywords the engines' grammar compilers read
//! have the JSON types they must have. Not a full meta-schema validation; it catches the mistakes that
//! would otherwise fail inside the engine (as a 500 or a generation error) instead of as a 400 here.

use serde_json::Value;

use super::codes::{refuse, INVALID_TYPE, INVALID_VALUE};
use crate::error::ApiError;

const TYPES: [&str; 7] = ["object", "array", "string", "number", "integer", "boolean", "null"];
/// Keywords whose value is one subschema.
const ONE_SCHEMA: [&str; 8] = [
    "items",
    "additionalProperties",
    "additionalItems",
    "not",
    "contains",
    "if",
    "then",
    "else",
];
/// Keywords whose value maps names to subschemas.
const SCHEMA_MAPS: [&str; 4] = ["properties", "patternProperties", "$defs", "definitions"];
/// Keywords whose value is a non-empty list of subschemas.
const SCHEMA_LISTS: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// `value` (at `param`) must be a JSON object that is a plausible JSON Schema.
pub fn check_schema_object(value: &Value, param: &str) -> Result<(), ApiError> {
    if !value.is_object() {
        return Err(refuse(
            param,
            INVALID_TYPE,
            format!("'{param}' must be a JSON Schema object"),
        ));
    }
    check_subschema(value, param)
}

fn check_subschema(value: &Value, param: &str) -> Result<(), ApiError> {
    let schema = match value {
        Value::Bool(_) => return Ok(()),
        Value::Object(schema) => schema,
        _ => {
            return Err(refuse(
                param,
                INVALID_TYPE,
                format!("'{param}' must be a schema (an object)"),
            ))
        }
    };
    for (key, v) in schema {
        let at = format!("{param}.{key}");
        match key.as_str() {
            "type" => check_type(v, &at)?,
            "required" if !v.as_array().is_some_and(|items| items.iter().all(Value::is_string)) => {
                return Err(refuse(
                    &at,
                    INVALID_TYPE,
                    format!("'{at}' must be a list of property names"),
                ));
            }
            "enum" if !v.is_array() => {
                return Err(refuse(&at, INVALID_TYPE, format!("'{at}' must be a list")));
            }
            k if ONE_SCHEMA.contains(&k) => match v {
                // Draft 4-7 tuple form of `items`.
                Value::Array(list) if k == "items" => {
                    for (i, sub) in list.iter().enumerate() {
                        check_subschema(sub, &format!("{at}[{i}]"))?;
                    }
                }
                _ => check_subschema(v, &at)?,
            },
            k if SCHEMA_MAPS.contains(&k) => {
                let map = v
                    .as_object()
                    .ok_or_else(|| refuse(&at, INVALID_TYPE, format!("'{at}' must be an object of schemas")))?;
                for (name, sub) in map {
                    check_subschema(sub, &format!("{at}.{name}"))?;
                }
            }
            k if SCHEMA_LISTS.contains(&k) => {
                let list = v
                    .as_array()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| refuse(&at, INVALID_TYPE, format!("'{at}' must be a non-empty list of schemas")))?;
                for (i, sub) in list.iter().enumerate() {
                    check_subschema(sub, &format!("{at}[{i}]"))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_type(v: &Value, at: &str) -> Result<(), ApiError> {
    let known = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
    let ok = match v {
        Value::String(_) => known(v),
        Value::Array(list) => !list.is_empty() && list.iter().all(known),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(refuse(
            at,
            INVALID_VALUE,
            format!("'{at}' must be one of {TYPES:?} or a list of them, got {v}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn accepts_real_schemas_and_names_the_bad_keyword() {
        let good = json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]},
                           "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}}},
            "required": ["city"],
            "$defs": {"Tag": {"enum": ["a", "b"]}},
            "anyOf": [true, {"required": ["days"]}]
        });
        assert!(check_schema_object(&good, "p").is_ok());
        let cases = [
            (json!("object"), "p"),
            (json!([]), "p"),
            (json!({"type": "dict"}), "p.type"),
            (json!({"type": []}), "p.type"),
            (json!({"properties": []}), "p.properties"),
            (json!({"properties": {"a": {"type": 5}}}), "p.properties.a.type"),
            (json!({"required": "a"}), "p.required"),
            (json!({"items": 3}), "p.items"),
            (json!({"anyOf": []}), "p.anyOf"),
            (json!({"$defs": {"X": {"type": "str"}}}), "p.$defs.X.type"),
            (json!({"enum": "a"}), "p.enum"),
        ];
        for (schema, param) in cases {
            let e = check_schema_object(&schema, "p").unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{schema}");
            assert!(e.code.is_some(), "{schema}");
        }
    }
}

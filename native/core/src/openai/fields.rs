//! Typed access to fields of a JSON request object, each failure an `ApiError` naming the field.

use serde_json::{Map, Value};

use crate::error::ApiError;

pub type Object = Map<String, Value>;

fn wrong_type(name: &str, expected: &str) -> ApiError {
    ApiError::invalid_param(name, format!("'{name}' must be {expected}"))
}

/// A field that is absent or JSON null is "not given".
fn given<'a>(obj: &'a Object, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

pub fn opt_bool(obj: &Object, name: &str) -> Result<Option<bool>, ApiError> {
    given(obj, name)
        .map(|v| v.as_bool().ok_or_else(|| wrong_type(name, "a boolean")))
        .transpose()
}

pub fn opt_str<'a>(obj: &'a Object, name: &str) -> Result<Option<&'a str>, ApiError> {
    given(obj, name)
        .map(|v| v.as_str().ok_or_else(|| wrong_type(name, "a string")))
        .transpose()
}

pub fn opt_object<'a>(obj: &'a Object, name: &str) -> Result<Option<&'a Object>, ApiError> {
    given(obj, name)
        .map(|v| v.as_object().ok_or_else(|| wrong_type(name, "an object")))
        .transpose()
}

/// A number within `[min, max]`.
pub fn opt_f32(obj: &Object, name: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
    let Some(v) = given(obj, name) else { return Ok(None) };
    let x = v.as_f64().ok_or_else(|| wrong_type(name, "a number"))?;
    if !(min..=max).contains(&x) {
        return Err(ApiError::invalid_param(
            name,
            format!("'{name}' must be {}, got {x}", float_range(min, max)),
        ));
    }
    Ok(Some(x as f32))
}

/// `[min, max]` in words; a lower bound of the smallest positive float reads "> 0" (it stands for an
/// open interval, and printed in full it is 300 digits long).
fn float_range(min: f64, max: f64) -> String {
    if min == f64::MIN_POSITIVE {
        format!("greater than 0 and at most {max}")
    } else {
        format!("between {min} and {max}")
    }
}

/// An integer within `[min, max]` (JSON floats with no fraction are accepted, as Python does).
pub fn opt_int(obj: &Object, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
    let Some(v) = given(obj, name) else { return Ok(None) };
    let x = match (v.as_i64(), v.as_f64()) {
        (Some(i), _) => i,
        (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => f as i64,
        _ => return Err(wrong_type(name, "an integer")),
    };
    if !(min..=max).contains(&x) {
        return Err(ApiError::invalid_param(
            name,
            format!("'{name}' must be between {min} and {max}, got {x}"),
        ));
    }
    Ok(Some(x))
}

/// A string or a list of strings (OpenAI's `stop`).
pub fn opt_str_or_list(obj: &Object, name: &str) -> Result<Vec<String>, ApiError> {
    match given(obj, name) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong_type(name, "a string or a list of strings"))
            })
            .collect(),
        Some(_) => Err(wrong_type(name, "a string or a list of strings")),
    }
}

pub fn opt_u32_list(obj: &Object, name: &str) -> Result<Vec<u32>, ApiError> {
    match given(obj, name) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_u64()
                    .filter(|&n| n <= u32::MAX as u64)
                    .map(|n| n as u32)
                    .ok_or_else(|| wrong_type(name, "a list of token ids"))
            })
            .collect(),
        Some(_) => Err(wrong_type(name, "a list of token ids")),
    }
}

//! The plugin's configuration (the filter's `configuration` string, JSON) and the key check.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `{"header": "x-api-key", "keys": {"team-a": "<key>", ...}}`: the request header that carries the key
/// and the accepted keys by the name a request is tagged with.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_header")]
    pub header: String,
    pub keys: BTreeMap<String, String>,
}

fn default_header() -> String {
    "x-api-key".to_string()
}

impl Config {
    pub fn parse(json: &[u8]) -> Result<Config, String> {
        let config: Config = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        if config.keys.is_empty() {
            return Err("no keys: every request would be refused".to_string());
        }
        if config.keys.values().any(|k| k.is_empty()) {
            return Err("an empty key".to_string());
        }
        Ok(Config {
            header: config.header.to_ascii_lowercase(),
            keys: config.keys,
        })
    }

    /// The name of the key `presented`, if it is one. Every key is compared, each in time independent of
    /// where they differ: the answer's timing tells nothing about a key.
    pub fn name_of(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        for (name, key) in &self.keys {
            if same(key.as_bytes(), presented.as_bytes()) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_known_by_its_name_and_nothing_else_is() {
        let config = Config::parse(br#"{"keys": {"team-a": "k-a", "team-b": "k-b"}}"#).unwrap();
        assert_eq!(config.header, "x-api-key");
        assert_eq!(config.name_of("k-b"), Some("team-b"));
        assert_eq!(config.name_of("k-"), None);
        assert_eq!(config.name_of("k-bb"), None);
        assert_eq!(config.name_of(""), None);
    }

    #[test]
    fn a_configuration_that_would_refuse_everything_or_is_misspelt_is_an_error() {
        assert!(Config::parse(br#"{"keys": {}}"#).is_err());
        assert!(Config::parse(br#"{"keys": {"a": ""}}"#).is_err());
        assert!(Config::parse(br#"{"key": {"a": "b"}}"#).is_err());
        let custom = Config::parse(br#"{"header": "X-Team-Key", "keys": {"a": "b"}}"#).unwrap();
        assert_eq!(custom.header, "x-team-key");
    }
}

//! Optional API keys: who may call the gateway, which models each key may use, how often.
//!
//! The control plane hands over the keys file's entries (extproc/api_keys.py): the SHA-256 of each key,
//! never the key, a name for logs, the models it may use and a requests-per-minute limit. The request
//! stream checks the `Authorization: Bearer <key>` header at request headers, before any body is read or
//! any engine is called: a missing or unknown key is a 401 `invalid_api_key`, a key over its rate a 429
//! with `retry-after`; a model the key may not use answers as a model that does not exist (404
//! `model_not_found`, as OpenAI answers for models a key has no access to), and `/v1/models` lists only
//! the key's models.
//!
//! The presented key is hashed and the digest looked up, so no comparison runs on the key itself.
//!
//! Each key is also a tenant: what the Responses API stores with it (responses, conversations) is marked
//! with the key's `owner`, a hash of the key's digest, and only that key finds it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The model-list entry that allows every served model.
pub const ANY_MODEL: &str = "*";

/// One key's grant as the keys file states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// Lower-case hex SHA-256 of the key.
    pub sha256: String,
    /// Who holds it, for logs and summaries.
    pub name: String,
    /// Served model names it may use; `*` for all.
    pub models: Vec<String>,
    /// Requests it may start per minute (a burst of up to that many); 0 for no limit.
    pub requests_per_minute: u32,
}

/// A key that passed: its name, the models it may use, and the tenant it is.
#[derive(Debug)]
pub struct Grant {
    pub name: String,
    models: Vec<String>,
    /// What stored responses and conversations are marked with (`owner_of` the key's digest).
    pub owner: String,
}

impl Grant {
    pub fn allows(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == ANY_MODEL || m == model)
    }
}

/// A token bucket of `capacity` requests refilled at `capacity` per minute.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(requests_per_minute: u32, now: Instant) -> Self {
        let capacity = f64::from(requests_per_minute);
        Bucket {
            capacity,
            tokens: capacity,
            at: now,
        }
    }

    /// Take one request's token, or the whole seconds until one is there.
    fn take(&mut self, now: Instant) -> Result<(), u64> {
        let per_second = self.capacity / 60.0;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / per_second).ceil().max(1.0) as u64)
        }
    }
}

struct Key {
    grant: Arc<Grant>,
    /// None: no rate limit.
    bucket: Option<Mutex<Bucket>>,
}

/// The configured keys, by the SHA-256 digest of the key.
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], Key>,
}

impl ApiKeys {
    /// Refuses a digest that is not 64 hex digits, a key listed twice, or a key without models.
    pub fn new(entries: Vec<KeyEntry>) -> Result<Self, String> {
        let now = Instant::now();
        let mut by_digest = HashMap::with_capacity(entries.len());
        for entry in entries {
            let digest = parse_digest(&entry.sha256)
                .ok_or_else(|| format!("key {:?}: sha256 must be 64 hex digits", entry.name))?;
            if entry.models.is_empty() {
                return Err(format!(
                    "key {:?}: models must name at least one model (or \"*\")",
                    entry.name
                ));
            }
            let key = Key {
                grant: Arc::new(Grant {
                    name: entry.name.clone(),
                    models: entry.models,
                    owner: owner_of(&digest),
                }),
                bucket: (entry.requests_per_minute > 0)
                    .then(|| Mutex::new(Bucket::new(entry.requests_per_minute, now))),
            };
            if by_digest.insert(digest, key).is_some() {
                return Err(format!("key {:?}: the same key is listed twice", entry.name));
            }
        }
        Ok(ApiKeys { by_digest })
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Check the request's `Authorization` header value and take one request from the key's rate.
    pub fn authorize(&self, authorization: Option<&str>, now: Instant) -> Result<Arc<Grant>, ApiError> {
        let presented = authorization
            .and_then(bearer_token)
            .ok_or_else(|| invalid_key("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."))?;
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let key = self
            .by_digest
            .get(&digest)
            .ok_or_else(|| invalid_key("Incorrect API key provided."))?;
        if let Some(bucket) = &key.bucket {
            if let Err(seconds) = bucket.lock().expect("rate bucket lock").take(now) {
                let mut e = ApiError::new(
                    429,
                    "rate_limit_error",
                    format!("Rate limit reached for key '{}': retry in {seconds} s.", key.grant.name),
                )
                .with_code("rate_limit_exceeded");
                e.retry_after_s = Some(seconds);
                return Err(e);
            }
        }
        Ok(key.grant.clone())
    }
}

/// The error for a model the key may not use: the same as for a model that does not exist.
pub fn model_not_allowed(model: &str) -> ApiError {
    let mut e = ApiError::not_found(format!(
        "The model '{model}' does not exist or you do not have access to it."
    ))
    .with_code("model_not_found");
    e.param = Some("model".into());
    e
}

/// The lower-case hex SHA-256 of `key`, as the keys file holds it.
pub fn key_digest_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The owner stored with a key's responses: the SHA-256 (hex) of the key's digest under a label of its
/// own, so the database holds neither the key nor the digest the keys file lists, and names the key by
/// its identity (the same key is the same tenant whatever its name; a new key is a new tenant).
fn owner_of(digest: &[u8; 32]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"extproc responses owner\0");
    hasher.update(digest);
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn invalid_key(message: &str) -> ApiError {
    ApiError::new(401, "invalid_request_error", message).with_code("invalid_api_key")
}

/// The key of `Bearer <key>` (the scheme in any case, as HTTP auth schemes are).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn keys(rpm: u32) -> ApiKeys {
        ApiKeys::new(vec![KeyEntry {
            sha256: key_digest_hex("sk-alice"),
            name: "alice".into(),
            models: vec!["m1".into()],
            requests_per_minute: rpm,
        }])
        .unwrap()
    }

    #[test]
    fn the_digest_is_sha256_in_hex() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            key_digest_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn only_a_listed_bearer_key_passes() {
        let keys = keys(0);
        let now = Instant::now();
        let grant = keys.authorize(Some("Bearer sk-alice"), now).unwrap();
        assert_eq!(grant.name, "alice");
        // The owner is stable per key, and holds neither the key nor the digest the keys file lists.
        assert_eq!(grant.owner.len(), 64);
        assert_ne!(grant.owner, key_digest_hex("sk-alice"));
        assert!(!grant.owner.contains("sk-alice"));
        assert_eq!(keys.authorize(Some("Bearer sk-alice"), now).unwrap().owner, grant.owner);
        assert!(grant.allows("m1") && !grant.allows("m2"));
        assert!(keys.authorize(Some("bearer  sk-alice "), now).is_ok());
        for bad in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Basic sk-alice"),
            Some("Bearer sk-bob"),
            Some("sk-alice"),
        ] {
            let e = keys.authorize(bad, now).unwrap_err();
            assert_eq!((e.status, e.code), (401, Some("invalid_api_key")), "{bad:?}");
        }
    }

    #[test]
    fn a_key_over_its_rate_waits_for_the_next_token() {
        let keys = keys(2);
        let t0 = Instant::now();
        assert!(keys.authorize(Some("Bearer sk-alice"), t0).is_ok());
        assert!(keys.authorize(Some("Bearer sk-alice"), t0).is_ok());
        let e = keys.authorize(Some("Bearer sk-alice"), t0).unwrap_err();
        assert_eq!((e.status, e.retry_after_s), (429, Some(30)));
        // Two per minute: one more after 30 s, not before.
        assert!(keys
            .authorize(Some("Bearer sk-alice"), t0 + Duration::from_secs(29))
            .is_err());
        assert!(keys
            .authorize(Some("Bearer sk-alice"), t0 + Duration::from_secs(31))
            .is_ok());
    }

    #[test]
    fn bad_entries_are_refused() {
        let entry = |sha: &str, models: Vec<String>| KeyEntry {
            sha256: sha.into(),
            name: "k".into(),
            models,
            requests_per_minute: 0,
        };
        assert!(ApiKeys::new(vec![entry("abc", vec!["*".into()])]).is_err());
        assert!(ApiKeys::new(vec![entry(&key_digest_hex("x"), vec![])]).is_err());
        let twice = vec![
            entry(&key_digest_hex("x"), vec!["*".into()]),
            entry(&key_digest_hex("x"), vec!["*".into()]),
        ];
        assert!(ApiKeys::new(twice).is_err());
        let any = ApiKeys::new(vec![entry(&key_digest_hex("x"), vec!["*".into()])]).unwrap();
        assert!(any
            .authorize(Some("Bearer x"), Instant::now())
            .unwrap()
            .allows("anything"));
    }

    #[test]
    fn each_key_is_its_own_tenant() {
        let entry = |key: &str| KeyEntry {
            sha256: key_digest_hex(key),
            name: "same name".into(),
            models: vec!["*".into()],
            requests_per_minute: 0,
        };
        let keys = ApiKeys::new(vec![entry("sk-a"), entry("sk-b")]).unwrap();
        let owner = |key: &str| {
            keys.authorize(Some(&format!("Bearer {key}")), Instant::now())
                .unwrap()
                .owner
                .clone()
        };
        assert_ne!(owner("sk-a"), owner("sk-b"), "the owner follows the key, not its name");
    }
}

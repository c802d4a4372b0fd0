//! The fuzzed surfaces, one module each. A target runs one input (a panic is the failure it looks for;
//! broken invariants are asserted), returns a signature of what the input became (the driver keeps inputs
//! with new signatures as seeds), and knows how to generate a fresh well-formed input of its own format.

pub mod engine_output;
pub mod grpc;
pub mod kv_events;
pub mod records;
pub mod request;
pub mod stream;
pub mod template;

use crate::rng::Rng;

pub struct Target {
    pub name: &'static str,
    /// Runs one input; returns a signature of the outcome (equal for inputs that went the same way).
    pub run: fn(&[u8]) -> u64,
    /// A fresh input built from the target's format.
    pub generate: fn(&mut Rng) -> Vec<u8>,
    /// A structure-aware change to an input (`None` when it is not of the format: bytes are mutated).
    pub mutate: fn(&mut Rng, &[u8]) -> Option<Vec<u8>>,
    /// Tokens byte mutations insert.
    pub dictionary: fn() -> Vec<&'static [u8]>,
}

pub const TARGETS: [Target; 5] = [
    request::TARGET,
    template::TARGET,
    grpc::TARGET,
    kv_events::TARGET,
    stream::TARGET,
];

pub fn by_name(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// FNV-1a: a stable hash for outcome signatures and crash file names.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A signature of a message with its numbers and quoted values left out, so "got 129" and "got 130",
/// or "model 'a' does not exist" and "model 'b' does not exist", count once.
pub fn signature(text: &str) -> u64 {
    let mut shape = Vec::with_capacity(text.len().min(160));
    let mut quoted = false;
    for b in text.bytes() {
        if b == b'\'' {
            quoted = !quoted;
            shape.push(b);
        } else if !quoted && !b.is_ascii_digit() {
            shape.push(b);
        }
        if shape.len() == 160 {
            break;
        }
    }
    fnv(&shape)
}

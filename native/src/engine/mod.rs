//! The engine protocols the gateway speaks (vLLM `VllmEngine`, SGLang `SglangScheduler`).

use std::fmt;
use std::str::FromStr;

/// Which gRPC service an engine endpoint serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub enum Protocol {
    #[default]
    Vllm,
    Sglang,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(Protocol::Vllm),
            "sglang" => Ok(Protocol::Sglang),
            other => Err(format!(
                "unknown engine protocol {other:?} (expected \"vllm\" or \"sglang\")"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Protocol;

    #[test]
    fn protocols_parse_by_name_only() {
        assert_eq!("vllm".parse::<Protocol>(), Ok(Protocol::Vllm));
        assert_eq!("sglang".parse::<Protocol>(), Ok(Protocol::Sglang));
        assert!("SGLang".parse::<Protocol>().is_err());
        assert!("".parse::<Protocol>().is_err());
    }
}

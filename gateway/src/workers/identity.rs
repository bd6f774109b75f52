//! Whether a worker serves the model of the bundle it would join: what its
//! `GetModelInfo` reports (on its backend's service) against the model
//! directory the gateway tokenizes for. The vocabulary size must be
//! reported and equal (token ids the gateway sends must mean the same
//! tokens); the model type (config.json's `model_type`) must be equal
//! when both sides know it. The served name is not compared: a worker may
//! serve the model under any name. Checked before a worker added at run
//! time takes traffic (`POST /admin/workers`).

use std::time::Duration;

use super::Worker;

/// What a model directory says the model is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// config.json's `model_type` ("" when it has none).
    pub model_type: String,
    /// The vocabulary size the gateway's token ids are checked against.
    pub vocab_size: u32,
}

/// What a worker's `GetModelInfo` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    pub served_model_name: String,
    pub model_type: String,
    /// 0: not reported.
    pub vocab_size: u32,
}

impl Reported {
    /// From the fields of any backend's answer (a negative size is none).
    pub fn new(served_model_name: String, model_type: String, vocab_size: i32) -> Reported {
        Reported {
            served_model_name,
            model_type,
            vocab_size: u32::try_from(vocab_size).unwrap_or(0),
        }
    }
}

impl ModelIdentity {
    /// `Ok` when `reported` is this model, else what differs.
    pub fn check(&self, reported: &Reported) -> Result<(), String> {
        let name = &reported.served_model_name;
        if reported.vocab_size == 0 {
            return Err(format!(
                "its GetModelInfo (model \"{name}\") reports no vocab_size; the model's is {}",
                self.vocab_size
            ));
        }
        if reported.vocab_size != self.vocab_size {
            return Err(format!(
                "it serves a vocabulary of {} tokens (model \"{name}\"); the model's has {}",
                reported.vocab_size, self.vocab_size
            ));
        }
        let known = !reported.model_type.is_empty() && !self.model_type.is_empty();
        if known && reported.model_type != self.model_type {
            return Err(format!(
                "it serves a model of type \"{}\" (model \"{name}\"); the model's type is \"{}\"",
                reported.model_type, self.model_type
            ));
        }
        Ok(())
    }
}

/// Asks `worker` (its backend known) what it serves and checks it
/// against `identity`.
pub async fn verify(
    worker: &Worker,
    identity: &ModelIdentity,
    timeout: Duration,
) -> Result<(), String> {
    let backend = worker
        .backend()
        .ok_or_else(|| "its backend is not known".to_owned())?;
    let call = backend.model_info(worker.channel(), timeout);
    let reported = match tokio::time::timeout(timeout, call).await {
        Ok(Ok(reported)) => reported,
        Ok(Err(status)) => {
            return Err(format!(
                "{backend} GetModelInfo: {:?}: {}",
                status.code(),
                status.message()
            ))
        }
        Err(_) => {
            return Err(format!(
                "{backend} GetModelInfo: no answer within {} ms",
                timeout.as_millis()
            ))
        }
    };
    identity.check(&reported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ModelIdentity {
        ModelIdentity {
            model_type: "qwen2_vl".into(),
            vocab_size: 1000,
        }
    }

    fn reported(model_type: &str, vocab_size: i32) -> Reported {
        Reported::new("m".into(), model_type.into(), vocab_size)
    }

    #[test]
    fn the_same_vocabulary_and_type_match() {
        assert_eq!(identity().check(&reported("qwen2_vl", 1000)), Ok(()));
        // A type one side does not know is not compared.
        assert_eq!(identity().check(&reported("", 1000)), Ok(()));
    }

    #[test]
    fn another_vocabulary_or_type_is_named() {
        let err = identity().check(&reported("qwen2_vl", 1200)).unwrap_err();
        assert!(
            err.contains("1200 tokens") && err.contains("has 1000"),
            "{err}"
        );
        let err = identity().check(&reported("gemma3", 1000)).unwrap_err();
        assert!(
            err.contains("\"gemma3\"") && err.contains("\"qwen2_vl\""),
            "{err}"
        );
        let err = identity().check(&reported("qwen2_vl", 0)).unwrap_err();
        assert!(err.contains("no vocab_size"), "{err}");
        let err = identity().check(&reported("qwen2_vl", -1)).unwrap_err();
        assert!(err.contains("no vocab_size"), "{err}");
    }
}

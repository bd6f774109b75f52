//! The worker protocol's Generate request for a prompt and the sampling
//! options every endpoint converts its wire request into.

use iris_openai::{Constraint, Sampling};
use iris_proto::scheduler::{sampling_params, GenerateRequest, SamplingParams, TokenizedInput};

/// The Generate request for the workers; they stream only when the client
/// does (one answer message per request otherwise).
pub fn generate_request(
    id: &str,
    input_ids: Vec<u32>,
    s: &Sampling,
    stream: bool,
) -> GenerateRequest {
    GenerateRequest {
        request_id: id.to_owned(),
        tokenized: Some(TokenizedInput {
            input_ids,
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k.map(|k| i32::try_from(k).unwrap_or(i32::MAX)),
            min_p: s.min_p,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            repetition_penalty: s.repetition_penalty,
            max_new_tokens: s.max_new_tokens,
            min_new_tokens: s.min_new_tokens,
            stop: s.stop.clone(),
            ignore_eos: s.ignore_eos,
            skip_special_tokens: true,
            n: s.n,
            logit_bias: s
                .logit_bias
                .iter()
                .map(|&(id, bias)| (id.to_string(), bias))
                .collect(),
            stop_token_ids: s.stop_token_ids.clone(),
            sampling_seed: s.seed,
            constraint: s.constraint.as_ref().map(proto_constraint),
            ..SamplingParams::default()
        }),
        return_logprob: s.logprobs.is_some(),
        top_logprobs_num: s
            .logprobs
            .map_or(0, |k| i32::try_from(k).unwrap_or(i32::MAX)),
        stream,
        ..GenerateRequest::default()
    }
}

/// The worker protocol's form of a decoding constraint.
fn proto_constraint(c: &Constraint) -> sampling_params::Constraint {
    use sampling_params::Constraint as P;
    match c {
        Constraint::JsonSchema(s) => P::JsonSchema(s.clone()),
        Constraint::Regex(s) => P::Regex(s.clone()),
        Constraint::Ebnf(s) => P::EbnfGrammar(s.clone()),
        Constraint::StructuralTag(s) => P::StructuralTag(s.clone()),
    }
}

//! Every way `parse_chat_request` refuses a body: status, `param` and the
//! message, and the OpenAI error body built from it.

use iris_openai::validate::check_token_ids;
use iris_openai::{parse_chat_request, ApiError, ErrorBody, ErrorKind};

const MSGS: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

/// A valid body with `extra` fields appended.
fn body_with(extra: &str) -> String {
    format!(
        r#"{{"model":"m",{MSGS}{}{extra}}}"#,
        if extra.is_empty() { "" } else { "," }
    )
}

fn reject(body: &str) -> ApiError {
    match parse_chat_request(body.as_bytes()) {
        Ok(req) => panic!("accepted {body}: {req:?}"),
        Err(e) => e,
    }
}

/// Asserts a 400 with `param` whose message contains `needle`.
fn assert_field(body: &str, param: Option<&str>, needle: &str) {
    let err = reject(body);
    assert_eq!(err.status, 400, "{err:?}");
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
    assert_eq!(err.param.as_deref(), param, "{err:?}");
    assert!(
        err.message.contains(needle),
        "{:?} lacks {needle:?}",
        err.message
    );
}

#[test]
fn malformed_json_reports_line_and_column() {
    let err = reject("{\"model\": \"m\",\n  \"messages\": [}");
    assert_eq!(err.status, 400);
    assert_eq!(err.param, None);
    assert!(
        err.message.starts_with("Malformed JSON body: "),
        "{}",
        err.message
    );
    assert!(err.message.contains("line 2 column"), "{}", err.message);
    let trailing = format!("{} trailing", body_with(""));
    for bad in ["", "{", "nul", &trailing, "\u{0}", "[1"] {
        let err = reject(bad);
        assert!(
            err.message.starts_with("Malformed JSON body"),
            "{bad:?}: {}",
            err.message
        );
    }
}

#[test]
fn type_errors_name_the_path() {
    let err = reject(
        r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":5}]}"#,
    );
    assert_eq!(err.param.as_deref(), Some("messages[1].content"));
    assert_eq!(
        err.message,
        "messages[1].content: invalid type: integer `5`, expected a string or an array of content parts"
    );
    assert_field(
        &body_with(r#""max_tokens":"10""#),
        Some("max_tokens"),
        "invalid type: string",
    );
    assert_field(
        &body_with(r#""max_tokens":-1"#),
        Some("max_tokens"),
        "invalid value",
    );
    assert_field(
        &body_with(r#""max_tokens":1.5"#),
        Some("max_tokens"),
        "invalid type",
    );
    assert_field(
        &body_with(r#""stream":"yes""#),
        Some("stream"),
        "expected a boolean",
    );
    assert_field(&body_with(r#""stop":[1]"#), Some("stop[0]"), "invalid type");
    assert_field(
        &body_with(r#""stop":{"a":1}"#),
        Some("stop"),
        "a string or an array of strings",
    );
    assert_field(&body_with(r#""seed":-5"#), Some("seed"), "invalid value");
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u","detail":"ultra"}}]}]}"#,
        Some("messages[0].content[0].image_url.detail"),
        "unknown variant `ultra`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":7}]}]}"#,
        Some("messages[0].content[0].image_url"),
        "a URL string or an object",
    );
    for not_object in [
        r#"[1,2]"#,
        r#"["m",[{"role":"user","content":"x"}]]"#,
        "\"x\"",
        " 5 ",
    ] {
        assert_field(
            not_object,
            None,
            "Invalid request body: expected a JSON object",
        );
    }
}

#[test]
fn missing_fields_are_named() {
    assert_field(
        &format!("{{{MSGS}}}"),
        Some("model"),
        "missing field `model`",
    );
    assert_field(
        r#"{"model":"m"}"#,
        Some("messages"),
        "missing field `messages`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"content":"x"}]}"#,
        Some("messages[0].role"),
        "missing field `role`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}"#,
        Some("messages[0].content[0].type"),
        "missing field `type`",
    );
}

#[test]
fn message_checks() {
    assert_field(
        r#"{"model":"m","messages":[]}"#,
        Some("messages"),
        "at least one message",
    );
    assert_field(
        r#"{"model":"","messages":[{"role":"user","content":"x"}]}"#,
        Some("model"),
        "must not be empty",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"function","content":"x","name":"f"}]}"#,
        Some("messages[0].role"),
        "role `function` are not supported",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#,
        Some("messages[0].role"),
        "unknown role `robot`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":null}]}"#,
        Some("messages[0].content"),
        "content is required for `user` messages",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"system"}]}"#,
        Some("messages[0].content"),
        "content is required for `system` messages",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[]}]}"#,
        Some("messages[0].content"),
        "must not be an empty array",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}"#,
        Some("messages[0].content[0]"),
        "`input_audio` are not supported",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"video"}]}]}"#,
        Some("messages[0].content[0]"),
        "unknown content part type `video`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
        Some("messages[0].content[0]"),
        "needs a string field `text`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
        Some("messages[0].content[0]"),
        "needs a field `image_url`",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":""}}]}]}"#,
        Some("messages[0].content[0].image_url.url"),
        "must not be empty",
    );
    assert_field(
        r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"image_url","image_url":"u"}]}]}"#,
        Some("messages[1].content[0]"),
        "only allowed in `user` messages",
    );
}

#[test]
fn numeric_ranges() {
    let cases: &[(&str, &str, &str)] = &[
        (r#""temperature":2.5"#, "temperature", "between 0 and 2"),
        (r#""temperature":-0.1"#, "temperature", "between 0 and 2"),
        (r#""temperature":1e300"#, "temperature", "between 0 and 2"),
        (r#""top_p":0"#, "top_p", "greater than 0 and at most 1"),
        (r#""top_p":1.01"#, "top_p", "greater than 0 and at most 1"),
        (r#""top_k":0"#, "top_k", "-1 (disabled) or at least 1"),
        (r#""top_k":-2"#, "top_k", "-1 (disabled) or at least 1"),
        (r#""min_p":1.5"#, "min_p", "between 0 and 1"),
        (
            r#""presence_penalty":2.1"#,
            "presence_penalty",
            "between -2 and 2",
        ),
        (
            r#""frequency_penalty":-3"#,
            "frequency_penalty",
            "between -2 and 2",
        ),
        (
            r#""repetition_penalty":0"#,
            "repetition_penalty",
            "greater than 0",
        ),
        (r#""max_tokens":0"#, "max_tokens", "at least 1"),
        (
            r#""max_completion_tokens":0"#,
            "max_completion_tokens",
            "at least 1",
        ),
        (
            r#""min_tokens":10,"max_tokens":5"#,
            "min_tokens",
            "greater than the maximum",
        ),
    ];
    for (extra, param, needle) in cases {
        assert_field(&body_with(extra), Some(param), needle);
    }
    for ok in [
        r#""temperature":0,"top_p":1,"top_k":1,"min_p":0,"presence_penalty":-2,"frequency_penalty":2"#,
        r#""temperature":2,"min_p":1,"repetition_penalty":0.01,"min_tokens":5,"max_tokens":5"#,
        r#""max_tokens":1,"max_completion_tokens":100,"min_tokens":50"#,
    ] {
        assert!(parse_chat_request(body_with(ok).as_bytes()).is_ok(), "{ok}");
    }
}

#[test]
fn stop_checks() {
    let many: Vec<String> = (0..17).map(|i| format!("\"s{i}\"")).collect();
    assert_field(
        &body_with(&format!(r#""stop":[{}]"#, many.join(","))),
        Some("stop"),
        "at most 16",
    );
    let sixteen = many[..16].join(",");
    assert!(parse_chat_request(body_with(&format!(r#""stop":[{sixteen}]"#)).as_bytes()).is_ok());
    assert_field(
        &body_with(r#""stop":["a",""]"#),
        Some("stop"),
        "must not be empty",
    );
    assert_field(
        &body_with(r#""stop":"""#),
        Some("stop"),
        "must not be empty",
    );
}

#[test]
fn sampling_fields_out_of_range() {
    let err = reject(&body_with(r#""n":17"#));
    assert_eq!(
        (err.status, err.param.as_deref(), err.message.as_str()),
        (400, Some("n"), "n: must be between 1 and 16, got 17")
    );
    assert_field(&body_with(r#""n":0"#), Some("n"), "between 1 and 16");
    assert_field(&body_with(r#""n":-3"#), Some("n"), "got -3");
    assert_field(
        &body_with(r#""top_logprobs":3"#),
        Some("top_logprobs"),
        "needs `logprobs: true`",
    );
    assert_field(
        &body_with(r#""logprobs":false,"top_logprobs":3"#),
        Some("top_logprobs"),
        "needs `logprobs: true`",
    );
    assert_field(
        &body_with(r#""logprobs":true,"top_logprobs":21"#),
        Some("top_logprobs"),
        "between 0 and 20, got 21",
    );
    assert_field(
        &body_with(r#""logit_bias":{"abc":1}"#),
        Some("logit_bias"),
        "key `abc` is not a token id",
    );
    assert_field(
        &body_with(r#""logit_bias":{"007":1}"#),
        Some("logit_bias"),
        "key `007`",
    );
    assert_field(
        &body_with(r#""logit_bias":{"-1":1}"#),
        Some("logit_bias"),
        "key `-1`",
    );
    assert_field(
        &body_with(r#""logit_bias":{"5":100.5}"#),
        Some("logit_bias"),
        "bias of `5` must be between -100 and 100",
    );
    assert_field(
        &body_with(r#""logit_bias":{"5":"x"}"#),
        Some("logit_bias.5"),
        "invalid type",
    );
    assert_field(
        &body_with(r#""stream_options":{"include_usage":true}"#),
        Some("stream_options"),
        "only allowed when `stream` is true",
    );
    assert_field(
        &body_with(r#""stream":false,"stream_options":{}"#),
        Some("stream_options"),
        "`stream` is true",
    );
    let ids: Vec<String> = (0..65).map(|i| i.to_string()).collect();
    assert_field(
        &body_with(&format!(r#""stop_token_ids":[{}]"#, ids.join(","))),
        Some("stop_token_ids"),
        "at most 64",
    );
    assert!(parse_chat_request(
        body_with(
            r#""n":16,"logprobs":true,"top_logprobs":20,"logit_bias":{"0":-100,"42":100},"stop_token_ids":[1,2]"#
        )
        .as_bytes()
    )
    .is_ok());
}

#[test]
fn token_ids_are_checked_against_the_vocabulary() {
    let check = |extra: &str| {
        let req = parse_chat_request(body_with(extra).as_bytes()).expect("valid");
        check_token_ids(&req, 100)
    };
    assert!(check(r#""logit_bias":{"99":5},"stop_token_ids":[0,99]"#).is_ok());
    let err = check(r#""logit_bias":{"3":1,"100":5}"#).err();
    assert_eq!(
        err.map(|e| (e.param, e.message)),
        Some((
            Some("logit_bias".into()),
            "logit_bias: key `100` is outside the model's vocabulary of 100 tokens".into()
        ))
    );
    let err = check(r#""stop_token_ids":[5,100]"#).err();
    assert_eq!(err.and_then(|e| e.param), Some("stop_token_ids[1]".into()));
}

#[test]
fn unknown_and_refused_fields_are_named() {
    assert_field(
        &body_with(r#""temprature":0.5"#),
        Some("temprature"),
        "temprature: unknown field",
    );
    assert_field(
        &body_with(r#""extra":null"#),
        Some("extra"),
        "unknown field",
    );
    for (field, value, needle) in [
        (
            "audio",
            r#"{"voice":"alloy","format":"mp3"}"#,
            "audio output",
        ),
        (
            "prediction",
            r#"{"type":"content","content":"x"}"#,
            "predicted outputs",
        ),
        ("web_search_options", "{}", "web search"),
        ("functions", r#"[{"name":"f"}]"#, "send `tools`"),
        ("function_call", r#""auto""#, "send `tool_choice`"),
        ("reasoning_effort", r#""low""#, "chat_template_kwargs"),
        ("metadata", r#"{"k":"v"}"#, "stores none"),
        ("store", "true", "only `false`"),
        ("service_tier", r#""flex""#, "`flex` is not available"),
        ("modalities", r#"["text","audio"]"#, "only `[\"text\"]`"),
    ] {
        assert_field(
            &body_with(&format!(r#""{field}":{value}"#)),
            Some(field),
            needle,
        );
    }
    assert!(parse_chat_request(
        body_with(
            r#""store":false,"service_tier":"default","modalities":["text"],"user":"u-1","functions":null,"metadata":null"#
        )
        .as_bytes()
    )
    .is_ok());
}

#[test]
fn unsupported_features() {
    assert_field(
        &body_with(r#""response_format":{"type":"xml"}"#),
        Some("response_format.type"),
        "unknown type `xml`",
    );
    assert!(
        parse_chat_request(body_with(r#""n":1,"logprobs":false,"top_logprobs":0"#).as_bytes())
            .is_ok()
    );
}

#[test]
fn error_body_has_the_openai_shape() {
    let err = reject(&body_with(r#""n":0"#));
    let body: ErrorBody = serde_json::from_slice(&err.body()).expect("error body parses");
    assert_eq!(body.error.message, "n: must be between 1 and 16, got 0");
    assert_eq!(body.error.kind, ErrorKind::InvalidRequest);
    assert_eq!(body.error.param.as_deref(), Some("n"));
    assert_eq!(body.error.code, None);
    let raw: serde_json::Value = serde_json::from_slice(&err.body()).expect("json");
    assert_eq!(
        raw,
        serde_json::json!({"error": {"message": "n: must be between 1 and 16, got 0", "type": "invalid_request_error", "param": "n", "code": null}})
    );
}

#[test]
fn constructors_set_status_kind_and_code() {
    let cases = [
        (
            ApiError::bad_request("x"),
            400,
            ErrorKind::InvalidRequest,
            None,
        ),
        (
            ApiError::bad_field("p", "x"),
            400,
            ErrorKind::InvalidRequest,
            None,
        ),
        (ApiError::not_found("x"), 404, ErrorKind::NotFound, None),
        (
            ApiError::model_not_found("gpt"),
            404,
            ErrorKind::NotFound,
            Some("model_not_found"),
        ),
        (
            ApiError::payload_too_large("x"),
            413,
            ErrorKind::InvalidRequest,
            Some("payload_too_large"),
        ),
        (
            ApiError::service_unavailable("x"),
            503,
            ErrorKind::Server,
            Some("service_unavailable"),
        ),
        (
            ApiError::bad_gateway("x"),
            502,
            ErrorKind::Server,
            Some("bad_gateway"),
        ),
        (
            ApiError::gateway_timeout("x"),
            504,
            ErrorKind::Server,
            Some("gateway_timeout"),
        ),
        (
            ApiError::internal("x"),
            500,
            ErrorKind::Server,
            Some("internal_error"),
        ),
    ];
    for (err, status, kind, code) in cases {
        assert_eq!(
            (err.status, err.kind, err.code.as_deref()),
            (status, kind, code),
            "{err:?}"
        );
        let body: ErrorBody = serde_json::from_slice(&err.body()).expect("parses");
        assert_eq!(body.error.kind, kind);
        assert_eq!(body.error.code.as_deref(), code);
    }
    let quoted = ApiError::bad_request("a \"quoted\"\nline\t\u{1}");
    let body: ErrorBody = serde_json::from_slice(&quoted.body()).expect("escaped");
    assert_eq!(body.error.message, "a \"quoted\"\nline\t\u{1}");
}

#[test]
fn message_fields_are_declared_or_refused() {
    let with_message = |message: &str| format!(r#"{{"model":"m","messages":[{message}]}}"#);
    assert_field(
        &with_message(r#"{"role":"user","content":"hi","cache_control":{}}"#),
        Some("messages[0].cache_control"),
        "unknown field `cache_control`",
    );
    // What a client echoes of an earlier answer: null is accepted.
    let echoed = r#"{"role":"user","content":"hi"},{"role":"assistant","content":"yo","refusal":null,"audio":null,"annotations":null,"function_call":null}"#;
    assert!(parse_chat_request(with_message(echoed).as_bytes()).is_ok());
    assert_field(
        &with_message(r#"{"role":"assistant","content":"no","refusal":"I can't"}"#),
        Some("messages[0].refusal"),
        "only null is accepted",
    );
}

#[test]
fn content_part_fields_are_declared_or_refused() {
    let with_part = |part: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"hi"}},{part}]}}]}}"#
        )
    };
    assert_field(
        &with_part(r#"{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}"#),
        Some("messages[0].content[1].cache_control"),
        "unknown field `cache_control`",
    );
    assert_field(
        &with_part(
            r#"{"type":"image_url","image_url":{"url":"data:,","detail":"low","size":"big"}}"#,
        ),
        Some("messages[0].content[1].image_url.size"),
        "unknown field `size`",
    );
    assert_field(
        &with_part(r#"{"type":"image_url","image_url":"data:,","text":"caption"}"#),
        Some("messages[0].content[1]"),
        "takes no `text`",
    );
    assert_field(
        &with_part(r#"{"type":"text","text":"x","image_url":"data:,"}"#),
        Some("messages[0].content[1]"),
        "takes no `image_url`",
    );
    // The declared keys still parse.
    let fine = with_part(r#"{"type":"image_url","image_url":{"url":"data:,","detail":"auto"}}"#);
    assert!(parse_chat_request(fine.as_bytes()).is_ok());
}

#[test]
fn video_parts_are_checked_like_images() {
    let with_part = |role: &str, part: &str| {
        format!(r#"{{"model":"m","messages":[{{"role":"{role}","content":[{part}]}}]}}"#)
    };
    let fine = with_part(
        "user",
        r#"{"type":"video_url","video_url":{"url":"data:video/mp4;base64,AAAA"}}"#,
    );
    let req = parse_chat_request(fine.as_bytes()).expect("a video part parses");
    let places: Vec<(String, String)> = req
        .video_parts()
        .map(|(place, video)| (place, video.url.clone()))
        .collect();
    assert_eq!(
        places,
        [(
            "messages[0].content[0]".to_owned(),
            "data:video/mp4;base64,AAAA".to_owned()
        )]
    );
    assert_eq!(req.image_parts().count(), 0);
    let bare = with_part(
        "user",
        r#"{"type":"video_url","video_url":"https://example.com/a.mp4"}"#,
    );
    assert!(parse_chat_request(bare.as_bytes()).is_ok());
    assert_field(
        &with_part("user", r#"{"type":"video_url","video_url":{"url":""}}"#),
        Some("messages[0].content[0].video_url.url"),
        "must not be empty",
    );
    assert_field(
        &with_part(
            "user",
            r#"{"type":"video_url","video_url":{"url":"data:,","fps":2}}"#,
        ),
        Some("messages[0].content[0].video_url.fps"),
        "unknown field `fps`",
    );
    assert_field(
        &with_part("user", r#"{"type":"video_url"}"#),
        Some("messages[0].content[0]"),
        "needs a field `video_url`",
    );
    assert_field(
        &with_part(
            "user",
            r#"{"type":"video_url","video_url":"data:,","image_url":"data:,"}"#,
        ),
        Some("messages[0].content[0]"),
        "takes no `image_url`",
    );
    assert_field(
        &with_part("assistant", r#"{"type":"video_url","video_url":"data:,"}"#),
        Some("messages[0].content[0]"),
        "video parts are only allowed in `user` messages",
    );
}

#[test]
fn mm_processor_kwargs_are_checked() {
    let video = r#"{"type":"video_url","video_url":"data:video/mp4;base64,AAAA"}"#;
    let image = r#"{"type":"image_url","image_url":"data:image/png;base64,AAAA"}"#;
    let body = |parts: &str, kwargs: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{parts}]}}],"mm_processor_kwargs":{kwargs}}}"#
        )
    };
    let req = parse_chat_request(body(video, r#"{"fps":1.5,"max_frames":8}"#).as_bytes())
        .expect("valid kwargs");
    let kw = req.mm_processor_kwargs.expect("kwargs kept");
    assert_eq!(
        (kw.fps, kw.max_frames, kw.num_frames),
        (Some(1.5), Some(8), None)
    );
    let cases = [
        (r#"{"fps":0}"#, "mm_processor_kwargs.fps", "positive"),
        (
            r#"{"fps":2,"num_frames":4}"#,
            "mm_processor_kwargs.num_frames",
            "exclusive",
        ),
        (
            r#"{"num_frames":0}"#,
            "mm_processor_kwargs.num_frames",
            "at least 1",
        ),
        (
            r#"{"min_frames":9,"max_frames":4}"#,
            "mm_processor_kwargs.min_frames",
            "above max_frames",
        ),
        (
            r#"{"min_pixels":900,"max_pixels":100}"#,
            "mm_processor_kwargs.min_pixels",
            "above max_pixels",
        ),
        (
            r#"{"temporal_patch_size":4}"#,
            "mm_processor_kwargs.temporal_patch_size",
            "unknown field",
        ),
        (
            r#"{"fps":"fast"}"#,
            "mm_processor_kwargs.fps",
            "invalid type",
        ),
    ];
    for (kwargs, param, needle) in cases {
        assert_field(&body(video, kwargs), Some(param), needle);
    }
    assert_field(
        &body(image, r#"{"fps":2}"#),
        Some("mm_processor_kwargs"),
        "no `video_url` part",
    );
    assert_field(
        &body(&format!("{video},{image}"), r#"{"max_pixels":50000}"#),
        Some("mm_processor_kwargs.max_pixels"),
        "videos only",
    );
    let mixed = body(&format!("{video},{image}"), r#"{"fps":1}"#);
    assert!(parse_chat_request(mixed.as_bytes()).is_ok());
    // Pan and scan shapes images: no video part needed, a video key still
    // wants one.
    let pans = parse_chat_request(body(image, r#"{"do_pan_and_scan":true}"#).as_bytes())
        .expect("pan and scan with an image");
    assert_eq!(
        pans.mm_processor_kwargs.and_then(|k| k.do_pan_and_scan),
        Some(true)
    );
    assert_field(
        &body(image, r#"{"do_pan_and_scan":true,"num_frames":4}"#),
        Some("mm_processor_kwargs"),
        "no `video_url` part",
    );
    assert_field(
        &body(image, r#"{"do_pan_and_scan":"yes"}"#),
        Some("mm_processor_kwargs.do_pan_and_scan"),
        "invalid type",
    );
}

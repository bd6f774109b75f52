//! Request bodies shaped like those the official `openai` Python client
//! sends (written by hand), parsed into the typed request and its sampling
//! view.

use iris_openai::{
    parse_chat_request, ContentPart, ImageDetail, ImageUrl, MessageContent, Role, Sampling, Stop,
};

fn parse(body: &str) -> iris_openai::ChatCompletionRequest {
    match parse_chat_request(body.as_bytes()) {
        Ok(req) => req,
        Err(e) => panic!("rejected: {e:?}\n{body}"),
    }
}

#[test]
fn minimal_text_request() {
    let req = parse(
        r#"{"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello!"}],"model":"qwen2-vl-7b"}"#,
    );
    assert_eq!(req.model, "qwen2-vl-7b");
    assert_eq!(req.messages.len(), 2);
    assert_eq!(req.messages[0].role, Role::System);
    assert_eq!(req.messages[1].text_content(), "Hello!");
    assert!(!req.is_stream());
    assert!(!req.include_usage());
    let expected = Sampling {
        n: 1,
        ..Sampling::default()
    };
    assert_eq!(req.sampling(), expected);
}

#[test]
fn streaming_with_usage_and_sampling() {
    let req = parse(
        r#"{
          "messages": [{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": "Count to 3", "name": "alice"},
                       {"role": "assistant", "content": null},
                       {"role": "user", "content": "please"}],
          "model": "m",
          "stream": true,
          "stream_options": {"include_usage": true},
          "max_tokens": 10,
          "max_completion_tokens": 64,
          "temperature": 0.7,
          "top_p": 0.9,
          "presence_penalty": 0.5,
          "frequency_penalty": -0.5,
          "seed": 1234,
          "stop": ["\n\n", "END"],
          "n": 1,
          "user": "user-1",
          "logprobs": false,
          "response_format": {"type": "text"},
          "top_k": 20,
          "min_p": 0.05,
          "repetition_penalty": 1.05,
          "ignore_eos": true,
          "min_tokens": 4
        }"#,
    );
    assert!(req.is_stream());
    assert!(req.include_usage());
    assert_eq!(req.messages[0].role.template_role(), "system");
    assert_eq!(req.messages[1].name.as_deref(), Some("alice"));
    assert_eq!(req.messages[2].content, None);
    let s = req.sampling();
    assert_eq!(
        s,
        Sampling {
            max_new_tokens: Some(64),
            min_new_tokens: 4,
            temperature: Some(0.7),
            top_p: Some(0.9),
            top_k: Some(20),
            min_p: Some(0.05),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-0.5),
            repetition_penalty: Some(1.05),
            seed: Some(1234),
            stop: vec!["\n\n".into(), "END".into()],
            ignore_eos: true,
            constraint: None,
            n: 1,
            ..Sampling::default()
        }
    );
}

#[test]
fn vision_request_with_parts() {
    let req = parse(
        r#"{"messages":[{"role":"user","content":[
            {"type":"text","text":"What's in this image?"},
            {"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"high"}},
            {"type":"image_url","image_url":"data:image/png;base64,iVBORw0KGgo="},
            {"type":"text","text":" And this one?"}]}],
          "model":"qwen2-vl","max_tokens":300}"#,
    );
    let content = req.messages[0].content.as_ref().expect("content");
    let MessageContent::Parts(parts) = content else {
        panic!("expected parts");
    };
    assert_eq!(parts.len(), 4);
    assert_eq!(
        parts[1],
        ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: "https://example.com/cat.png".into(),
                detail: Some(ImageDetail::High)
            }
        }
    );
    let urls: Vec<&str> = content.images().map(|i| i.url.as_str()).collect();
    assert_eq!(
        urls,
        [
            "https://example.com/cat.png",
            "data:image/png;base64,iVBORw0KGgo="
        ]
    );
    assert_eq!(content.joined_text(), "What's in this image? And this one?");
    assert_eq!(req.sampling().max_new_tokens, Some(300));
    let places: Vec<(String, &str)> = req
        .image_parts()
        .map(|(place, image)| (place, image.url.as_str()))
        .collect();
    assert_eq!(
        places,
        [
            (
                "messages[0].content[1]".to_owned(),
                "https://example.com/cat.png"
            ),
            (
                "messages[0].content[2]".to_owned(),
                "data:image/png;base64,iVBORw0KGgo="
            )
        ]
    );
}

#[test]
fn known_fields_and_nulls_are_accepted() {
    let req = parse(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],
            "store":false,"service_tier":"auto","modalities":["text"],"user":"u-1",
            "temperature":null,"stop":null,"tools":[],"tool_choice":"none",
            "logit_bias":null,"top_logprobs":null,"seed":null,"metadata":null,
            "stream_options":null,"stream":false,"functions":null}"#,
    );
    let expected = Sampling {
        n: 1,
        ..Sampling::default()
    };
    assert_eq!(req.sampling(), expected);
    assert!(!req.include_usage());
    assert_eq!(req.user.as_deref(), Some("u-1"));
}

#[test]
fn sampling_fields_reach_the_settings() {
    let req = parse(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":3,
            "logit_bias":{"50256":-100,"7":2.5},"logprobs":true,"top_logprobs":4,
            "stop_token_ids":[9,8],"seed":11,"min_tokens":2}"#,
    );
    let s = req.sampling();
    assert_eq!(s.n, 3);
    assert_eq!(s.logit_bias, vec![(7, 2.5), (50256, -100.0)]);
    assert_eq!(s.logprobs, Some(4));
    assert_eq!(s.stop_token_ids, vec![9, 8]);
    assert_eq!((s.seed, s.min_new_tokens), (Some(11), 2));
    let plain =
        parse(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true}"#);
    assert_eq!(plain.sampling().logprobs, Some(0));
}

#[test]
fn stop_as_single_string_and_integers_as_floats() {
    let req = parse(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"\n","temperature":1,"top_k":-1}"#,
    );
    assert_eq!(req.stop, Some(Stop::One("\n".into())));
    let s = req.sampling();
    assert_eq!(s.stop, vec!["\n".to_string()]);
    assert_eq!(s.temperature, Some(1.0));
    assert_eq!(s.top_k, None, "-1 means disabled");
}

#[test]
fn include_usage_needs_the_option() {
    let req = parse(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{}}"#,
    );
    assert!(!req.include_usage());
}

#[test]
fn request_round_trips_through_serde() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u","detail":"low"}}]},{"role":"assistant","content":"b"}],"stream":true,"stop":["x"],"max_tokens":5}"#;
    let req = parse(body);
    let again = serde_json::to_vec(&req).expect("serialize");
    assert_eq!(parse_chat_request(&again).expect("reparse"), req);
}

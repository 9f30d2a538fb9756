//! Golden tests of rendered prompts. The expected files under `golden/expected/` were produced by
//! Python's Jinja2 set up as Hugging Face sets it up (`golden/render_with_jinja2.py`), so these
//! tests prove the minijinja environment renders the same bytes as the reference renderer on
//! real-world-shaped templates (Llama 3.1, Qwen 2.5, Qwen 3, a content-parts template, and a
//! sampler of Python-isms and `tojson` options).

use crate::common;

use std::path::PathBuf;

use pdgate_tokenize::{
    fixture, ChatInput, ChatTemplate, ContentFormat, SpecialTokens, TemplateError,
};
use serde_json::{json, Value};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn render_case(spec: &Value, case: &Value) -> (ContentFormat, Result<String, TemplateError>) {
    let source = std::fs::read_to_string(
        golden_dir()
            .join("templates")
            .join(case["template"].as_str().unwrap()),
    )
    .unwrap();
    let template = ChatTemplate::new(&source).expect("template compiles");
    let tools = case.get("tools").map(|name| {
        spec["tools"][name.as_str().unwrap()]
            .as_array()
            .unwrap()
            .as_slice()
    });
    let documents = case
        .get("documents")
        .map(|d| d.as_array().unwrap().as_slice());
    let specials = SpecialTokens {
        bos_token: case
            .get("bos_token")
            .and_then(Value::as_str)
            .map(str::to_owned),
        eos_token: case
            .get("eos_token")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ..SpecialTokens::default()
    };
    let input = ChatInput {
        messages: case["messages"].as_array().unwrap(),
        tools,
        documents,
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        continue_final_message: false,
        template_kwargs: case.get("kwargs").and_then(Value::as_object),
    };
    (
        template.content_format(),
        template.render(&input, &specials),
    )
}

#[test]
fn rendered_prompts_equal_hugging_faces_jinja2_byte_for_byte() {
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join("cases.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    for case in spec["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let expected =
            std::fs::read_to_string(golden_dir().join("expected").join(format!("{name}.txt")))
                .unwrap();
        let (format, rendered) = render_case(&spec, case);
        assert_eq!(
            format.as_str(),
            case["content_format"].as_str().unwrap(),
            "{name}: content format"
        );
        let got = match rendered {
            Ok(text) => text,
            Err(TemplateError::Raised(msg)) => format!("RAISE: {msg}"),
            Err(other) => panic!("{name}: {other}"),
        };
        assert_eq!(
            got, expected,
            "{name}: rendered prompt differs from Jinja2's"
        );
        checked += 1;
    }
    assert_eq!(checked, 11);
}

#[test]
fn chatml_fixture_renders_and_encodes_exactly() {
    let t = common::chatml();
    let messages = [
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world!"}]}),
        json!({"role": "assistant", "content": "Hi."}),
        json!({"role": "user", "content": "東京?"}),
    ];
    let prompt = t
        .render_chat(&ChatInput {
            messages: &messages,
            add_generation_prompt: true,
            ..ChatInput::default()
        })
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello world!<|im_end|>\n\
         <|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>user\n東京?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let ids = t.encode(&prompt, false).unwrap();
    assert_eq!(ids.first(), Some(&fixture::IM_START_ID));
    assert_eq!(ids.iter().filter(|&&i| i == fixture::IM_END_ID).count(), 4);
    assert_eq!(t.decode(&ids, false).unwrap(), prompt);
    // The special tokens vanish with skip_special_tokens.
    assert!(!t.decode(&ids, true).unwrap().contains("<|im_"));
}

fn render(source: &str, input: &ChatInput<'_>) -> Result<String, TemplateError> {
    ChatTemplate::new(source)
        .unwrap()
        .render(input, &SpecialTokens::default())
}

#[test]
fn absent_tools_and_documents_are_undefined_not_none() {
    let src = "{{ tools is defined }} {{ documents is defined }} {{ bos_token is defined }}";
    let messages = [json!({"role": "user", "content": "x"})];
    let input = ChatInput {
        messages: &messages,
        ..ChatInput::default()
    };
    assert_eq!(render(src, &input).unwrap(), "False False False");
    let tools = [json!({"type": "function"})];
    let with = ChatInput {
        tools: Some(&tools),
        documents: Some(&[]),
        ..input
    };
    assert_eq!(render(src, &with).unwrap(), "True True False");
}

#[test]
fn template_kwargs_win_over_everything_else() {
    let src = "{{ add_generation_prompt }} {{ enable_thinking }} {{ bos_token }}";
    let kwargs =
        json!({"add_generation_prompt": "kw", "enable_thinking": false, "bos_token": "<B>"});
    let input = ChatInput {
        add_generation_prompt: true,
        template_kwargs: kwargs.as_object(),
        ..ChatInput::default()
    };
    let t = ChatTemplate::new(src).unwrap();
    let specials = SpecialTokens {
        bos_token: Some("<s>".into()),
        ..SpecialTokens::default()
    };
    assert_eq!(t.render(&input, &specials).unwrap(), "kw False <B>");
}

#[test]
fn raise_exception_is_a_request_error_with_the_templates_message() {
    let err = render(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}",
        &ChatInput {
            messages: &[json!({"role": "assistant", "content": "x"})],
            ..ChatInput::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        TemplateError::Raised(
            "Conversation roles must alternate user/assistant/user/assistant/...".into()
        )
    );
    assert!(err.message().contains("roles must alternate"));
}

#[test]
fn a_template_that_fails_on_the_clients_data_is_a_render_error() {
    let err = render(
        "{{ messages[0].content.nope.deeper }}",
        &ChatInput {
            messages: &[json!({"role": "user", "content": "x"})],
            ..ChatInput::default()
        },
    )
    .unwrap_err();
    let TemplateError::Render(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("undefined"), "{msg}");
}

#[test]
fn strftime_now_prints_todays_date() {
    let out = render("{{ strftime_now('%Y-%m-%d') }}", &ChatInput::default()).unwrap();
    let b = out.as_bytes();
    assert_eq!(out.len(), 10, "{out}");
    assert!(
        b[4] == b'-' && b[7] == b'-' && out.starts_with("20"),
        "{out}"
    );
}

#[test]
fn continue_final_message_cuts_after_the_final_text() {
    let t = common::chatml();
    let messages = [
        json!({"role": "user", "content": "Write a haiku."}),
        json!({"role": "assistant", "content": "Autumn moonlight "}),
    ];
    let prompt = t
        .render_chat(&ChatInput {
            messages: &messages,
            continue_final_message: true,
            ..ChatInput::default()
        })
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\nAutumn moonlight "
    );
    let both = t.render_chat(&ChatInput {
        messages: &messages,
        continue_final_message: true,
        add_generation_prompt: true,
        ..ChatInput::default()
    });
    assert!(matches!(both, Err(TemplateError::ContinueFinalMessage(_))));
}

#[test]
fn object_keys_reach_the_template_in_the_clients_order() {
    // serde_json's preserve_order: a tool schema printed with tojson keeps the client's order,
    // as a Python dict does.
    let tools: Value =
        serde_json::from_str(r#"[{"z": 1, "a": 2, "m": {"y": 0, "b": 1}}]"#).unwrap();
    let out = render(
        "{{ tools[0]|tojson }}",
        &ChatInput {
            tools: Some(tools.as_array().unwrap()),
            ..ChatInput::default()
        },
    )
    .unwrap();
    assert_eq!(out, r#"{"z": 1, "a": 2, "m": {"y": 0, "b": 1}}"#);
}

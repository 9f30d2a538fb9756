//! Loading model directories as SMG's `--model-path` / `--tokenizer-path` / `--chat-template` do,
//! and the errors a broken directory gives (each names the file and what is wrong).

use crate::common;

use common::TempDir;
use pdgate_tokenize::{fixture, ChatInput, ContentFormat, ModelSource, Tokenizer};
use serde_json::{json, Value};

fn chatml_dir(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    fixture::write_model_dir(dir.path()).unwrap();
    dir
}

fn edit_json(dir: &TempDir, name: &str, edit: impl FnOnce(&mut Value)) {
    let path = dir.path().join(name);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string(&v).unwrap()).unwrap();
}

fn load_err(source: &ModelSource) -> String {
    Tokenizer::load(source).unwrap_err().to_string()
}

fn user(text: &str) -> [Value; 1] {
    [json!({"role": "user", "content": text})]
}

#[test]
fn the_fixture_loads_with_its_tokens_eos_ids_and_template() {
    let t = common::chatml();
    assert_eq!(t.vocab_size(), fixture::VOCAB_SIZE);
    // config.json's eos_token_id, then generation_config.json's, without duplicates.
    assert_eq!(
        t.eos_token_ids(),
        &[fixture::ENDOFTEXT_ID, fixture::IM_END_ID]
    );
    assert_eq!(
        t.special_tokens().eos_token.as_deref(),
        Some(fixture::IM_END)
    );
    // pad_token was written as an AddedToken object.
    assert_eq!(
        t.special_tokens().pad_token.as_deref(),
        Some(fixture::ENDOFTEXT)
    );
    assert_eq!(t.special_tokens().bos_token, None);
    assert_eq!(t.content_format(false), Some(ContentFormat::String));
    assert_eq!(t.token_to_id(fixture::IM_START), Some(fixture::IM_START_ID));
    assert!(t.is_special_token(fixture::IM_END_ID));
    assert!(!t.is_special_token(u32::from(b'a')));
    assert_eq!(t.token_piece(u32::from(b' ')).as_deref(), Some("Ġ"));
    assert_eq!(t.token_text(u32::from(b' ')).unwrap(), " ");
    assert_eq!(
        t.single_token_id(fixture::IM_END).unwrap(),
        Some(fixture::IM_END_ID)
    );
    assert_eq!(t.single_token_id("東京は日本").unwrap(), None);
    // Some token of the vocabulary ends inside a UTF-8 character.
    assert!((256..fixture::ENDOFTEXT_ID).any(|id| t.token_text(id).unwrap().contains('\u{FFFD}')));
}

#[test]
fn tokenizer_path_may_name_the_tokenizer_json_file() {
    let dir = chatml_dir("tokfile");
    let t = Tokenizer::load(&ModelSource {
        tokenizer_path: Some(dir.path().join("tokenizer.json")),
        ..ModelSource::default()
    })
    .unwrap();
    // The configs come from the file's directory.
    assert_eq!(
        t.eos_token_ids(),
        &[fixture::ENDOFTEXT_ID, fixture::IM_END_ID]
    );
    assert!(t.chat_templates().default_template().is_some());
}

#[test]
fn model_path_supplies_eos_ids_when_the_tokenizer_comes_from_elsewhere() {
    let model = TempDir::new("model-only");
    model.write("config.json", r#"{"eos_token_id": 7}"#);
    model.write("generation_config.json", r#"{"eos_token_id": [8, 7]}"#);
    let tok = chatml_dir("tok-only");
    let t = Tokenizer::load(&ModelSource {
        model_path: Some(model.path().to_path_buf()),
        tokenizer_path: Some(tok.path().to_path_buf()),
        chat_template: None,
    })
    .unwrap();
    // Union of both directories' configs, the model's first.
    assert_eq!(
        t.eos_token_ids(),
        &[7, 8, fixture::ENDOFTEXT_ID, fixture::IM_END_ID]
    );
}

#[test]
fn without_eos_ids_in_the_configs_the_tokenizers_eos_token_ends_generation() {
    let dir = chatml_dir("no-eos");
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    edit_json(&dir, "config.json", |v| {
        v.as_object_mut().unwrap().remove("eos_token_id");
    });
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(t.eos_token_ids(), &[fixture::IM_END_ID]);
}

#[test]
fn explicit_chat_template_wins_over_the_directorys() {
    let dir = chatml_dir("explicit");
    dir.write("chat_template.jinja", "from the directory");
    let jinja = dir.write(
        "override.jinja",
        "{% for m in messages %}[{{ m.content }}]{% endfor %}\n",
    );
    let t = Tokenizer::load(&ModelSource {
        model_path: Some(dir.path().to_path_buf()),
        chat_template: Some(jinja),
        ..ModelSource::default()
    })
    .unwrap();
    let input = ChatInput {
        messages: &user("hi"),
        ..ChatInput::default()
    };
    assert_eq!(t.render_chat(&input).unwrap(), "[hi]");

    let json_file = dir.write(
        "override.json",
        r#"{"chat_template": "json:{{ messages[0].content }}"}"#,
    );
    let t = Tokenizer::load(&ModelSource {
        model_path: Some(dir.path().to_path_buf()),
        chat_template: Some(json_file),
        ..ModelSource::default()
    })
    .unwrap();
    assert_eq!(t.render_chat(&input).unwrap(), "json:hi");
}

#[test]
fn template_files_are_found_in_smgs_order() {
    let dir = chatml_dir("order");
    edit_json(&dir, "tokenizer_config.json", |v| {
        v.as_object_mut().unwrap().remove("chat_template");
    });
    dir.write("zzz.jinja", "other jinja");
    let input = ChatInput {
        messages: &user("x"),
        ..ChatInput::default()
    };
    assert_eq!(
        Tokenizer::from_dir(dir.path())
            .unwrap()
            .render_chat(&input)
            .unwrap(),
        "other jinja"
    );
    dir.write("chat_template.jinja", "chat_template.jinja");
    assert_eq!(
        Tokenizer::from_dir(dir.path())
            .unwrap()
            .render_chat(&input)
            .unwrap(),
        "chat_template.jinja"
    );
    dir.write(
        "chat_template.json",
        r#"{"chat_template": "chat_template.json"}"#,
    );
    assert_eq!(
        Tokenizer::from_dir(dir.path())
            .unwrap()
            .render_chat(&input)
            .unwrap(),
        "chat_template.json"
    );
    edit_json(&dir, "tokenizer_config.json", |v| {
        v["chat_template"] = json!("tokenizer_config.json");
    });
    assert_eq!(
        Tokenizer::from_dir(dir.path())
            .unwrap()
            .render_chat(&input)
            .unwrap(),
        "tokenizer_config.json"
    );
}

#[test]
fn named_templates_pick_tool_use_when_the_request_has_tools() {
    let dir = chatml_dir("named");
    edit_json(&dir, "tokenizer_config.json", |v| {
        v["chat_template"] = json!([
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %} with {{ tools|length }} tools"}
        ]);
    });
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    let input = ChatInput {
        messages: &user("x"),
        ..ChatInput::default()
    };
    assert_eq!(t.render_chat(&input).unwrap(), "plain");
    let parts = [json!({"role": "user", "content": [{"type": "text", "text": "parts"}]})];
    let tools = [json!({"type": "function"})];
    let with_tools = ChatInput {
        messages: &parts,
        tools: Some(&tools),
        ..ChatInput::default()
    };
    assert_eq!(t.content_format(true), Some(ContentFormat::OpenAi));
    assert_eq!(t.render_chat(&with_tools).unwrap(), "parts with 1 tools");
}

#[test]
fn no_template_is_an_error_only_when_rendering() {
    let dir = chatml_dir("none");
    edit_json(&dir, "tokenizer_config.json", |v| {
        v.as_object_mut().unwrap().remove("chat_template");
    });
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    let input = ChatInput {
        messages: &user("x"),
        ..ChatInput::default()
    };
    let err = t.render_chat(&input).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    assert!(!t.encode("still encodes", false).unwrap().is_empty());
}

#[test]
fn add_bos_token_rebuilds_the_post_processor() {
    let dir = TempDir::new("bos");
    fixture::write_sentencepiece_model_dir(dir.path()).unwrap();
    edit_json(&dir, "tokenizer.json", |v| {
        v["post_processor"] = Value::Null
    });
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    let ids = t.encode("Hello", true).unwrap();
    assert_eq!(ids[0], fixture::SP_BOS_ID);
    assert_ne!(t.encode("Hello", false).unwrap()[0], fixture::SP_BOS_ID);
    // The template writes the BOS itself.
    let input = ChatInput {
        messages: &user("Hi"),
        ..ChatInput::default()
    };
    assert_eq!(t.render_chat(&input).unwrap(), "<s>[INST] Hi [/INST]");
    let bad = [json!({"role": "system", "content": "x"})];
    let err = t
        .render_chat(&ChatInput {
            messages: &bad,
            ..ChatInput::default()
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "chat template rejected the request: Only user and assistant roles are supported!"
    );
}

#[test]
fn errors_name_the_file_and_the_problem() {
    assert!(load_err(&ModelSource::default()).contains("--model-path"));

    let empty = TempDir::new("empty");
    let err = load_err(&ModelSource::dir(empty.path()));
    assert!(
        err.contains("tokenizer.json") && err.contains("not found"),
        "{err}"
    );

    let missing = empty.path().join("nope");
    let err = load_err(&ModelSource::dir(&missing));
    assert!(err.contains("nope") && err.contains("not found"), "{err}");

    let cases: [(&str, &str, &str, &str); 7] = [
        (
            "tokenizer.json",
            "{\"model\": 3}",
            "tokenizer.json",
            "not a tokenizer",
        ),
        (
            "tokenizer_config.json",
            "{not json",
            "tokenizer_config.json",
            "not valid JSON",
        ),
        (
            "tokenizer_config.json",
            "[]",
            "tokenizer_config.json",
            "not a JSON object",
        ),
        (
            "tokenizer_config.json",
            r#"{"chat_template": 5}"#,
            "tokenizer_config.json",
            "chat_template must be",
        ),
        (
            "tokenizer_config.json",
            r#"{"eos_token": 5}"#,
            "tokenizer_config.json",
            "eos_token must be",
        ),
        (
            "generation_config.json",
            r#"{"eos_token_id": "2"}"#,
            "generation_config.json",
            "eos_token_id must be",
        ),
        (
            "tokenizer_config.json",
            r#"{"chat_template": "{% for %}"}"#,
            "tokenizer_config.json",
            "does not compile",
        ),
    ];
    for (file, content, names, says) in cases {
        let dir = chatml_dir("broken");
        dir.write(file, content);
        let err = load_err(&ModelSource::dir(dir.path()));
        assert!(err.contains(names) && err.contains(says), "{file}: {err}");
    }

    let dir = chatml_dir("missing-override");
    let err = load_err(&ModelSource {
        model_path: Some(dir.path().to_path_buf()),
        chat_template: Some(dir.path().join("absent.jinja")),
        ..ModelSource::default()
    });
    assert!(
        err.contains("absent.jinja") && err.contains("--chat-template"),
        "{err}"
    );
}

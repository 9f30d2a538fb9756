//! The shape a PD request body must have for its route before any engine sees it (issue 12):
//! the input an engine cannot serve without (`messages`, a prompt, `/generate`'s text or ids,
//! Anthropic's `max_tokens`), and the JSON kind and range of the sampling fields the gateway
//! only forwards (output caps, `temperature`, `top_p`, `sampling_params`). An engine that trusts
//! its input would otherwise answer nonsense, and a real one spends a prefill before its 400/500.
//!
//! Read from the one scan the gateway already did ([`TopLevel`]): each rule looks at the raw
//! bytes of its own field only, nothing is built or rewritten, nothing is allocated (short of a
//! nested key written with escapes), and every field not named here passes through untouched. The fields [`crate::classify`] reads for its facts
//! (`model`, `stream`, `n`, `prompt`, `text`, `input_ids`, …) are type-checked there, where they
//! are read. A JSON `null` counts as absent, as it does there.
//!
//! `/v1/responses` gets only its output-cap check (the field the gateway already reads and
//! rewrites on vLLM prefill legs); `/v1/rerank` and count_tokens get nothing beyond `classify`.

use crate::body::TopLevel;
use crate::classify::ClassifyError;
use crate::fields;
use crate::route::Route;
use crate::value::{self, Kind};

/// What a checked field must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// A JSON integer literal ≥ 0, any magnitude: whether a cap fits the model is the engine's
    /// to judge (it answers 400 without a prefill).
    Count,
    /// A JSON integer literal ≥ 1.
    PositiveCount,
    /// A JSON number ≥ 0.
    NonNegativeNumber,
    /// A JSON number in [0, 1] (OpenAI's `top_p` range).
    Probability,
    /// A non-empty array of objects, each with a string `role`.
    Messages,
    Object,
    Array,
    /// A string or an array of strings (vLLM's base64 `prompt_embeds`).
    Strings,
    /// Any kind: only presence is checked here, the kind where the field is read (`classify`).
    Any,
}

impl Shape {
    /// The 400 phrase ("field `x` must be …") of a field that is not of this shape.
    fn expected(self) -> &'static str {
        match self {
            Shape::Count => "a non-negative integer",
            Shape::PositiveCount => "an integer of at least 1",
            Shape::NonNegativeNumber => "a number of at least 0",
            Shape::Probability => "a number between 0 and 1",
            Shape::Messages => "a non-empty list of objects, each with a string `role`",
            Shape::Object => "an object",
            Shape::Array => "a list",
            Shape::Strings => "a string or a list of strings",
            Shape::Any => "present",
        }
    }

    fn accepts(self, raw: &[u8]) -> bool {
        match self {
            Shape::Count => value::is_non_negative_integer(raw),
            Shape::PositiveCount => value::is_non_negative_integer(raw) && raw != b"0",
            Shape::NonNegativeNumber => value::as_f64(raw).is_some_and(|v| v >= 0.0),
            Shape::Probability => value::as_f64(raw).is_some_and(|v| (0.0..=1.0).contains(&v)),
            Shape::Messages => {
                let mut len = 0usize;
                let all_have_roles = value::for_each_element_member(raw, fields::ROLE, |role| {
                    len += 1;
                    role.is_some_and(|r| value::kind(r) == Some(Kind::String))
                });
                all_have_roles && len > 0
            }
            Shape::Object => value::kind(raw) == Some(Kind::Object),
            Shape::Array => value::kind(raw) == Some(Kind::Array),
            Shape::Strings => match value::kind(raw) {
                Some(Kind::String) => true,
                Some(Kind::Array) => value::array_shape(raw).is_some_and(|s| s.all(Kind::String)),
                _ => false,
            },
            Shape::Any => true,
        }
    }
}

/// Whether a field must be there.
#[derive(Clone, Copy, Debug)]
enum Need {
    Optional,
    Required,
    /// Required unless one of these fields is present (an alternative input); the phrase says so.
    Unless(&'static [&'static str], &'static str),
}

/// One field's rule: the key, the name its 400 message gives (a member of a nested object is
/// named with its path), whether it must be there, its shape, and the rules for its members
/// when it is an object.
#[derive(Debug)]
struct Rule {
    key: &'static str,
    name: &'static str,
    need: Need,
    shape: Shape,
    members: &'static [Rule],
}

const fn optional(key: &'static str, shape: Shape) -> Rule {
    Rule {
        key,
        name: key,
        need: Need::Optional,
        shape,
        members: &[],
    }
}

const fn required(key: &'static str, shape: Shape) -> Rule {
    Rule {
        need: Need::Required,
        ..optional(key, shape)
    }
}

const TEMPERATURE: Rule = optional(fields::TEMPERATURE, Shape::NonNegativeNumber);
const TOP_P: Rule = optional(fields::TOP_P, Shape::Probability);

const CHAT: &[Rule] = &[
    required(fields::MESSAGES, Shape::Messages),
    optional(fields::MAX_TOKENS, Shape::Count),
    optional(fields::MAX_COMPLETION_TOKENS, Shape::Count),
    TEMPERATURE,
    TOP_P,
];

/// Anthropic requires `max_tokens` (its API answers 400 without it) and allows no 0.
const ANTHROPIC_MESSAGES: &[Rule] = &[
    required(fields::MESSAGES, Shape::Messages),
    required(fields::MAX_TOKENS, Shape::PositiveCount),
    TEMPERATURE,
    TOP_P,
];

/// vLLM takes `prompt_embeds` instead of a prompt.
const COMPLETIONS: &[Rule] = &[
    Rule {
        need: Need::Unless(
            &[fields::PROMPT_EMBEDS],
            "present unless `prompt_embeds` is given",
        ),
        ..optional(fields::PROMPT, Shape::Any)
    },
    optional(fields::PROMPT_EMBEDS, Shape::Strings),
    optional(fields::MAX_TOKENS, Shape::Count),
    TEMPERATURE,
    TOP_P,
];

/// SGLang's `/generate` takes its input as `text`, `input_ids` or `input_embeds`. Its sampling
/// numbers live in `sampling_params` (SMG reads that as one object; SGLang's list-per-item form
/// for batches is not SMG's API either).
const GENERATE: &[Rule] = &[
    Rule {
        need: Need::Unless(
            &[fields::INPUT_IDS, fields::INPUT_EMBEDS],
            "present when neither `input_ids` nor `input_embeds` is given",
        ),
        ..optional(fields::TEXT, Shape::Any)
    },
    optional(fields::INPUT_EMBEDS, Shape::Array),
    Rule {
        members: SAMPLING_PARAMS,
        ..optional(fields::SAMPLING_PARAMS, Shape::Object)
    },
];

const SAMPLING_PARAMS: &[Rule] = &[
    Rule {
        name: "sampling_params.max_new_tokens",
        ..optional(fields::MAX_NEW_TOKENS, Shape::Count)
    },
    Rule {
        name: "sampling_params.temperature",
        ..TEMPERATURE
    },
    Rule {
        name: "sampling_params.top_p",
        ..TOP_P
    },
];

const RESPONSES: &[Rule] = &[optional(fields::MAX_OUTPUT_TOKENS, Shape::Count)];

fn rules(route: Route) -> &'static [Rule] {
    match route {
        Route::ChatCompletions => CHAT,
        Route::Messages => ANTHROPIC_MESSAGES,
        Route::Completions => COMPLETIONS,
        Route::Generate => GENERATE,
        Route::Responses => RESPONSES,
        Route::Rerank | Route::CountTokens => &[],
    }
}

/// Checks the shape of `route`'s body (scanned into `top`); the first field that breaks its
/// rule, in the table's order, is the error.
pub fn check_shape(route: Route, body: &[u8], top: &TopLevel) -> Result<(), ClassifyError> {
    check_rules(rules(route), Fields::Top(body, top))
}

/// Where a rule's field is looked up: the body's top level, or a nested object's raw bytes.
#[derive(Clone, Copy)]
enum Fields<'b> {
    Top(&'b [u8], &'b TopLevel),
    Object(&'b [u8]),
}

impl<'b> Fields<'b> {
    /// The raw value of `key`, `None` when absent or `null` (last duplicate wins).
    fn get(self, key: &str) -> Option<&'b [u8]> {
        match self {
            Fields::Top(body, top) => top.get_non_null(body, key),
            Fields::Object(raw) => value::object_get(raw, key).filter(|v| *v != b"null"),
        }
    }
}

fn check_rules(rules: &[Rule], fields: Fields<'_>) -> Result<(), ClassifyError> {
    for rule in rules {
        let wrong = |expected| ClassifyError {
            field: rule.name,
            expected,
        };
        match (fields.get(rule.key), rule.need) {
            (None, Need::Optional) => {}
            (None, Need::Required) => return Err(wrong(rule.shape.expected())),
            (None, Need::Unless(others, phrase)) => {
                if !others.iter().any(|k| fields.get(k).is_some()) {
                    return Err(wrong(phrase));
                }
            }
            (Some(raw), _) => {
                if !rule.shape.accepts(raw) {
                    return Err(wrong(rule.shape.expected()));
                }
                if !rule.members.is_empty() {
                    check_rules(rule.members, Fields::Object(raw))?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::scan_object;

    fn check(route: Route, body: &str) -> Result<(), String> {
        let top = scan_object(body.as_bytes()).unwrap();
        check_shape(route, body.as_bytes(), &top).map_err(|e| e.to_string())
    }

    fn accepted(route: Route, body: &str) {
        if let Err(e) = check(route, body) {
            panic!("{route:?} {body}: refused: {e}");
        }
    }

    /// The refusal's message, asserting it names `field`.
    fn refused(route: Route, body: &str, field: &str) -> String {
        let e = check(route, body).expect_err(body);
        assert!(
            e.starts_with(&format!("field `{field}` must be ")),
            "{route:?} {body}: {e}"
        );
        e
    }

    const MSG: &str = r#"[{"role":"user","content":"hi"}]"#;

    /// A chat body with `extra` top-level entries (`"k":v,…` text).
    fn chat(extra: &str) -> String {
        format!(r#"{{"model":"m","messages":{MSG}{}{extra}}}"#, sep(extra))
    }

    fn anthropic(extra: &str) -> String {
        format!(
            r#"{{"messages":{MSG},"max_tokens":8{}{extra}}}"#,
            sep(extra)
        )
    }

    fn completion(extra: &str) -> String {
        format!(r#"{{"prompt":"a"{}{extra}}}"#, sep(extra))
    }

    fn generate(sampling_params: &str) -> String {
        format!(r#"{{"text":"a","sampling_params":{sampling_params}}}"#)
    }

    fn sep(extra: &str) -> &'static str {
        if extra.is_empty() {
            ""
        } else {
            ","
        }
    }

    #[test]
    fn chat_messages_must_be_a_non_empty_list_of_objects_with_a_string_role() {
        for route in [Route::ChatCompletions, Route::Messages] {
            let with = |messages: &str| {
                format!(r#"{{"messages":{messages},"max_tokens":1,"unknown":{{"x":[1]}}}}"#)
            };
            accepted(route, &with(MSG));
            accepted(
                route,
                &with(r#"[{"role":"system","content":[]},{"r\u006fle":"user"}]"#),
            );
            accepted(route, &with(r#"[{"role":7,"role":"user"}]"#));
            for bad in [
                r#""not-a-list""#,
                "[]",
                "{}",
                "5",
                r#"["hi"]"#,
                "[null]",
                "[[]]",
                r#"[{"content":"no role"}]"#,
                r#"[{"role":null}]"#,
                r#"[{"role":1}]"#,
                r#"[{"role":["user"]}]"#,
                r#"[{"role":"user"},{"role":{}}]"#,
                r#"[{"role":"user","role":1}]"#,
                r#"[{"content":{"role":"user"}}]"#,
            ] {
                let e = refused(route, &with(bad), "messages");
                assert_eq!(
                    e,
                    "field `messages` must be a non-empty list of objects, each with a string `role`"
                );
            }
        }
    }

    #[test]
    fn chat_without_messages_is_refused_and_null_counts_as_missing() {
        refused(Route::ChatCompletions, r#"{"model":"m"}"#, "messages");
        refused(Route::ChatCompletions, "{}", "messages");
        refused(Route::ChatCompletions, r#"{"messages":null}"#, "messages");
        refused(Route::Messages, r#"{"max_tokens":1}"#, "messages");
    }

    #[test]
    fn anthropic_messages_require_max_tokens_of_at_least_one() {
        accepted(Route::Messages, &anthropic(""));
        let body = |cap: &str| format!(r#"{{"messages":{MSG},"max_tokens":{cap}}}"#);
        accepted(Route::Messages, &body("1"));
        accepted(Route::Messages, &body("99999999999999999999999"));
        for bad in [
            "0", "-1", "-0", "1.0", "1e3", r#""8""#, "true", "[8]", "null",
        ] {
            let e = refused(Route::Messages, &body(bad), "max_tokens");
            assert_eq!(
                e, "field `max_tokens` must be an integer of at least 1",
                "{bad}"
            );
        }
        refused(
            Route::Messages,
            &format!(r#"{{"messages":{MSG}}}"#),
            "max_tokens",
        );
    }

    #[test]
    fn output_caps_are_non_negative_integers_and_zero_is_allowed() {
        let cases = [
            (Route::ChatCompletions, fields::MAX_TOKENS),
            (Route::ChatCompletions, fields::MAX_COMPLETION_TOKENS),
            (Route::Completions, fields::MAX_TOKENS),
            (Route::Responses, fields::MAX_OUTPUT_TOKENS),
        ];
        for (route, cap) in cases {
            let body = |v: &str| match route {
                Route::ChatCompletions => chat(&format!(r#""{cap}":{v}"#)),
                Route::Completions => completion(&format!(r#""{cap}":{v}"#)),
                _ => format!(r#"{{"input":"a","{cap}":{v}}}"#),
            };
            for good in [
                "0",
                "1",
                "16",
                "null",
                "1234567890123456789012345678901234567890",
            ] {
                accepted(route, &body(good));
            }
            for bad in [
                "-1", "-0", "0.5", "1.0", "1e2", r#""16""#, "false", "[]", "{}",
            ] {
                let e = refused(route, &body(bad), cap);
                assert!(e.ends_with("must be a non-negative integer"), "{e}");
            }
        }
    }

    /// A valid body of the route with extra top-level entries.
    type BodyWith = fn(&str) -> String;

    /// The routes that take `temperature` and `top_p` at the top level.
    const TOP_LEVEL_SAMPLING: [(Route, BodyWith); 3] = [
        (Route::ChatCompletions, chat),
        (Route::Completions, completion),
        (Route::Messages, anthropic),
    ];

    #[test]
    fn temperature_is_a_number_of_at_least_zero() {
        for (route, body) in TOP_LEVEL_SAMPLING {
            for good in ["0", "0.0", "-0.0", "1", "0.7", "2", "1e1", "null"] {
                accepted(route, &body(&format!(r#""temperature":{good}"#)));
            }
            for bad in ["-1", "-0.01", "-1e-3", r#""0.7""#, "true", "[0]", "{}"] {
                let e = refused(
                    route,
                    &body(&format!(r#""temperature":{bad}"#)),
                    "temperature",
                );
                assert!(e.ends_with("must be a number of at least 0"), "{e}");
            }
        }
    }

    #[test]
    fn top_p_is_a_number_between_zero_and_one() {
        for (route, body) in TOP_LEVEL_SAMPLING {
            for good in ["0", "0.0", "0.95", "1", "1.0", "1e0", "null"] {
                accepted(route, &body(&format!(r#""top_p":{good}"#)));
            }
            for bad in ["-0.1", "1.01", "2", "1e1", r#""1""#, "true", "[]"] {
                let e = refused(route, &body(&format!(r#""top_p":{bad}"#)), "top_p");
                assert!(e.ends_with("must be a number between 0 and 1"), "{e}");
            }
        }
    }

    #[test]
    fn completions_need_a_prompt_unless_prompt_embeds_is_given() {
        accepted(Route::Completions, r#"{"prompt":"a"}"#);
        accepted(Route::Completions, r#"{"prompt_embeds":"AAAA"}"#);
        accepted(Route::Completions, r#"{"prompt_embeds":["AAAA","BBBB"]}"#);
        accepted(
            Route::Completions,
            r#"{"prompt":null,"prompt_embeds":"AAAA"}"#,
        );
        for missing in ["{}", r#"{"prompt":null}"#, r#"{"prompt_embeds":null}"#] {
            let e = refused(Route::Completions, missing, "prompt");
            assert_eq!(
                e,
                "field `prompt` must be present unless `prompt_embeds` is given"
            );
        }
        for bad in ["5", "{}", r#"["a",1]"#, "[[1]]"] {
            let body = format!(r#"{{"prompt_embeds":{bad}}}"#);
            refused(Route::Completions, &body, "prompt_embeds");
        }
    }

    #[test]
    fn generate_needs_text_input_ids_or_input_embeds() {
        accepted(Route::Generate, r#"{"text":"a"}"#);
        accepted(Route::Generate, r#"{"input_ids":[1,2]}"#);
        accepted(Route::Generate, r#"{"input_embeds":[[0.5,1.0]]}"#);
        accepted(Route::Generate, r#"{"text":null,"input_ids":[[1]]}"#);
        for missing in [
            "{}",
            r#"{"sampling_params":{"max_new_tokens":1}}"#,
            r#"{"text":null,"input_ids":null,"input_embeds":null}"#,
        ] {
            let e = refused(Route::Generate, missing, "text");
            assert_eq!(
                e,
                "field `text` must be present when neither `input_ids` nor `input_embeds` is given"
            );
        }
        refused(Route::Generate, r#"{"input_embeds":"x"}"#, "input_embeds");
        refused(Route::Generate, r#"{"input_embeds":{}}"#, "input_embeds");
    }

    #[test]
    fn generate_sampling_params_must_be_an_object() {
        accepted(Route::Generate, &generate("{}"));
        accepted(Route::Generate, r#"{"text":"a","sampling_params":null}"#);
        for bad in ["[]", r#"[{"max_new_tokens":1}]"#, "1", r#""{}""#, "true"] {
            let e = refused(Route::Generate, &generate(bad), "sampling_params");
            assert_eq!(e, "field `sampling_params` must be an object");
        }
    }

    #[test]
    fn generate_sampling_params_members_follow_the_top_level_rules() {
        let cases = [
            (
                "max_new_tokens",
                &["0", "1", "4096"][..],
                &["-1", "1.5", "\"8\""][..],
            ),
            (
                "temperature",
                &["0", "0.0", "1.5"],
                &["-0.5", "\"1\"", "[]"],
            ),
            ("top_p", &["0", "0.9", "1"], &["1.5", "-1", "false"]),
        ];
        for (member, good, bad) in cases {
            for v in good.iter().chain(&["null"]) {
                accepted(
                    Route::Generate,
                    &generate(&format!(r#"{{"{member}":{v}}}"#)),
                );
            }
            for v in bad {
                let body = generate(&format!(r#"{{"{member}":{v},"other":[1]}}"#));
                refused(Route::Generate, &body, &format!("sampling_params.{member}"));
            }
        }
        // Last duplicate wins, as the engine's JSON reader has it; escaped keys are the same key.
        accepted(
            Route::Generate,
            &generate(r#"{"temperature":-1,"temperature":1}"#),
        );
        refused(
            Route::Generate,
            &generate(r#"{"t\u0065mperature":-1}"#),
            "sampling_params.temperature",
        );
        // The top-level names belong to other routes: /generate does not read them.
        accepted(
            Route::Generate,
            r#"{"text":"a","temperature":-1,"max_tokens":-1,"top_p":9}"#,
        );
    }

    #[test]
    fn responses_rerank_and_count_tokens_are_left_to_the_engine() {
        accepted(
            Route::Responses,
            r#"{"input":5,"temperature":-1,"top_p":9,"max_tokens":-1}"#,
        );
        for route in [Route::Rerank, Route::CountTokens] {
            accepted(
                route,
                r#"{"messages":"x","max_tokens":-1,"temperature":-1}"#,
            );
            accepted(route, "{}");
        }
    }

    #[test]
    fn fields_the_rules_do_not_name_never_change_the_verdict() {
        let unknown = r#""x_custom":{"messages":5,"max_tokens":-1},"temperature_x":-1,"rolez":[]"#;
        accepted(Route::ChatCompletions, &chat(unknown));
        accepted(Route::Messages, &anthropic(unknown));
        accepted(Route::Completions, &completion(unknown));
        refused(
            Route::ChatCompletions,
            &format!(r#"{{"model":"m",{unknown}}}"#),
            "messages",
        );
    }

    #[test]
    fn the_first_broken_rule_in_table_order_is_reported() {
        refused(
            Route::ChatCompletions,
            r#"{"top_p":5,"max_tokens":-1,"messages":[]}"#,
            "messages",
        );
        refused(
            Route::ChatCompletions,
            &chat(r#""top_p":5,"max_tokens":-1"#),
            "max_tokens",
        );
    }
}

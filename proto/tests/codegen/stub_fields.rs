//! The field numbers we compiled are the ones the engines' servicers run with.
//!
//! The servicers import the `*_pb2.py` stubs of `smg-grpc-proto`, not our .proto files.
//! `proto/check_stubs.py` lists every message, reserved range, field, enum value and RPC those
//! stubs describe into `proto/stub-fields.txt`; this test builds the same listing from the
//! descriptor set protox compiled from `proto/*.proto` (the one the generated code came from)
//! and wants the two equal.

use std::collections::BTreeSet;

use prost::Message;
use prost_types::field_descriptor_proto::Label;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};

const STUB_LISTING: &str = include_str!("../../stub-fields.txt");

fn field_type(field: &prost_types::FieldDescriptorProto) -> String {
    if !field.type_name().is_empty() {
        return field.type_name().to_owned();
    }
    let name = field.r#type().as_str_name(); // "TYPE_INT32"
    name.trim_start_matches("TYPE_").to_lowercase()
}

fn field_label(message: &DescriptorProto, field: &prost_types::FieldDescriptorProto) -> String {
    if field.label() == Label::Repeated {
        "repeated".to_owned()
    } else if field.proto3_optional() {
        "optional".to_owned()
    } else if let Some(index) = field.oneof_index {
        format!("oneof:{}", message.oneof_decl[index as usize].name())
    } else {
        "singular".to_owned()
    }
}

fn list_message(lines: &mut Vec<String>, file: &str, scope: &str, message: &DescriptorProto) {
    let name = format!("{scope}.{}", message.name());
    lines.push(format!("message {file} {name}"));
    for reserved in &message.reserved_range {
        lines.push(format!(
            "reserved {file} {name} {} {}",
            reserved.start(),
            reserved.end()
        ));
    }
    for field in &message.field {
        lines.push(format!(
            "field {file} {name} {} {} {} {}",
            field.name(),
            field.number(),
            field_type(field),
            field_label(message, field),
        ));
    }
    for nested in &message.nested_type {
        list_message(lines, file, &name, nested);
    }
    for nested in &message.enum_type {
        list_enum(lines, file, &name, nested);
    }
}

fn list_enum(lines: &mut Vec<String>, file: &str, scope: &str, enumeration: &EnumDescriptorProto) {
    for value in &enumeration.value {
        lines.push(format!(
            "enum {file} {scope}.{} {} {}",
            enumeration.name(),
            value.name(),
            value.number(),
        ));
    }
}

fn list_file(lines: &mut Vec<String>, file: &FileDescriptorProto) {
    let (name, package) = (file.name(), file.package());
    for message in &file.message_type {
        list_message(lines, name, package, message);
    }
    for enumeration in &file.enum_type {
        list_enum(lines, name, package, enumeration);
    }
    for service in &file.service {
        for method in &service.method {
            lines.push(format!(
                "rpc {name} {package}.{} {} {} {} {} {}",
                service.name(),
                method.name(),
                method.input_type(),
                method.output_type(),
                method.client_streaming(),
                method.server_streaming(),
            ));
        }
    }
}

#[test]
fn field_numbers_match_the_servicers_stubs() {
    let set = FileDescriptorSet::decode(pdgate_proto::FILE_DESCRIPTOR_SET)
        .expect("build.rs wrote an encoded FileDescriptorSet");

    // Every compiled file but the well-known types protox brings in for the imports; a file
    // vendored here but not listed by check_stubs.py (or the other way round) shows as a diff.
    let mut ours = Vec::new();
    for file in &set.file {
        if !file.name().starts_with("google/protobuf/") {
            list_file(&mut ours, file);
        }
    }
    ours.sort();

    let stubs: Vec<&str> = STUB_LISTING
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect();
    assert!(
        stubs.len() > 700,
        "stub-fields.txt looks truncated ({} lines)",
        stubs.len()
    );

    let ours_set: BTreeSet<&str> = ours.iter().map(String::as_str).collect();
    let stubs_set: BTreeSet<&str> = stubs.iter().copied().collect();
    let only_ours: Vec<_> = ours_set.difference(&stubs_set).collect();
    let only_stubs: Vec<_> = stubs_set.difference(&ours_set).collect();
    assert!(
        only_ours.is_empty() && only_stubs.is_empty(),
        "compiled protos and servicer stubs disagree\n  only in proto/*.proto: {only_ours:#?}\n  \
         only in the stubs: {only_stubs:#?}"
    );
    // Same lines, same count (a duplicated line in either listing would hide in the sets).
    assert_eq!(ours, stubs);
}

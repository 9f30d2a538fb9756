//! `pdgate demo`: starts mock engines and the gateway on loopback from the embedded demo config
//! and shows a PD handoff (written once the mock engines land).

use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {}

pub fn run(_args: DemoArgs) -> ExitCode {
    eprintln!("pdgate demo: not available yet");
    ExitCode::FAILURE
}

//! The `pdgate` command. Every way of starting builds one validated config:
//!
//! * `pdgate run -c conf/pdgate.yaml` — from the YAML file (Pingora's keys + a `gateway:` section);
//! * `pdgate launch --pd-disaggregation --prefill URL [PORT|none] --decode URL ...` — SMG's flags;
//! * `pdgate check -c FILE` — validate a config and exit (non-zero with the reason when wrong);
//! * `pdgate demo` — start mock engines and the gateway on loopback and show a PD handoff.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pdgate::blocks::BlockCache;
use pdgate::config::{self, LaunchArgs, LoadedConfig};
use pingora::server::configuration::Opt;

/// glibc's malloc with a per-thread cache of 1–16 KiB blocks in front (`pdgate::blocks`), on
/// when `serve` tunes the allocator.
#[global_allocator]
static ALLOCATOR: BlockCache = BlockCache::new();

#[derive(Parser)]
#[command(
    name = "pdgate",
    version,
    about = "Prefill/decode disaggregation gateway on Pingora"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Pingora process flags shared by `run` and `launch`.
#[derive(clap::Args, Clone, Debug, Default)]
struct ProcessFlags {
    /// Take over the listeners of a running pdgate (graceful upgrade; send it SIGQUIT).
    #[arg(short = 'u', long)]
    upgrade: bool,
    /// Run in the background.
    #[arg(short = 'd', long)]
    daemon: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway from a YAML config.
    Run {
        #[arg(short = 'c', long = "conf", value_name = "FILE")]
        conf: PathBuf,
        #[command(flatten)]
        process: ProcessFlags,
    },
    /// Run the gateway from SMG-compatible `launch` flags.
    Launch {
        #[command(flatten)]
        args: Box<LaunchArgs>,
        #[command(flatten)]
        process: ProcessFlags,
    },
    /// Validate a YAML config and exit.
    Check {
        #[arg(short = 'c', long = "conf", value_name = "FILE")]
        conf: PathBuf,
    },
    /// Start mock engines and the gateway on loopback and show a PD handoff.
    Demo(pdgate::demo::DemoArgs),
}

fn main() -> ExitCode {
    let argv = config::normalize_launch_argv(std::env::args().collect());
    let cli = Cli::parse_from(argv);
    match cli.command {
        Command::Check { conf } => match config::load_file(&conf) {
            Ok(loaded) => {
                for notice in &loaded.notices {
                    eprintln!("note: {notice}");
                }
                println!("{}: ok", conf.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", conf.display());
                ExitCode::FAILURE
            }
        },
        Command::Run { conf, process } => match config::load_file(&conf) {
            Ok(loaded) => serve(loaded, process),
            Err(e) => {
                eprintln!("{}: {e}", conf.display());
                ExitCode::FAILURE
            }
        },
        Command::Launch { args, process } => match args.into_config() {
            Ok(loaded) => serve(loaded, process),
            Err(e) => {
                eprintln!("pdgate launch: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Demo(args) => pdgate::demo::run(args),
    }
}

fn serve(loaded: LoadedConfig, process: ProcessFlags) -> ExitCode {
    if tune_malloc() {
        ALLOCATOR.enable();
    }
    init_logging(&loaded);
    pdgate::listen_check::exit_when_a_listener_fails();
    for notice in &loaded.notices {
        log::warn!("{notice}");
    }
    let opt = Opt {
        upgrade: process.upgrade,
        daemon: process.daemon,
        nocapture: false,
        test: false,
        conf: None,
    };
    match pdgate::server::build(loaded, opt) {
        Ok(server) => pdgate::server::run(server),
        Err(e) => {
            eprintln!("pdgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// glibc's allocator, tuned for a proxy whose buffers come and go by the request (see "glibc
/// keeps freed memory" in docs/architecture.md):
///
/// * bodies up to 4 MiB come from the heap rather than each being a fresh `mmap` (their pages
///   faulted in again on every request), and up to 64 MiB freed at the top of a heap stays
///   there instead of being handed back to the kernel and faulted in by the next body. Measured
///   on 256 KiB prompts: page faults and `madvise` were 12% of the gateway's CPU (bench/README).
///   The cost: memory freed after a burst is kept for the next one.
/// * each thread's cache of freed small chunks (tcache) holds 32 of a size, not 7. A request
///   frees more than 7 chunks of several sizes; past the cache they go to the fastbins, which
///   the next allocation over 1 KiB (a body, a leg's request) consolidates: ~2.5% of the
///   gateway's CPU in `malloc_consolidate` and `unlink_chunk` alone, 5–7% of its CPU per
///   request in all (bench/README, "Round 2, fifth part"). At most 32 chunks of each size
///   under 1 KiB stay cached per thread, ~1 MiB.
///
/// * blocks from 1 to 16 KiB, which the tcache does not take, are cached per thread by the
///   global allocator (`pdgate::blocks`): without it the two workers contended for malloc's
///   arena locks (bench/README, "Round 2, sixth part").
///
/// The tcache's size can only be set through `GLIBC_TUNABLES` when the process starts, so
/// pdgate sets it there and re-executes itself once, before any thread exists (same pid,
/// arguments and descriptors). An operator's own `glibc.malloc.*` tunables win and turn all of
/// this off, the block cache included; without the re-execution (it failed), the first two are
/// set with `mallopt`. Returns whether the allocator is pdgate's to tune (not the operator's).
fn tune_malloc() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        const MMAP_THRESHOLD: usize = 4 << 20;
        const TRIM_THRESHOLD: usize = 64 << 20;
        const TCACHE_COUNT: usize = 32;
        let current = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let ours = format!(
            "glibc.malloc.tcache_count={TCACHE_COUNT}:glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"
        );
        if current.contains("glibc.malloc.") {
            // Ours after the re-execution, or the operator's.
            let re_executed = current.ends_with(&ours);
            if re_executed {
                restore_process_name();
            }
            return re_executed;
        }
        let tunables = if current.is_empty() {
            ours
        } else {
            format!("{current}:{ours}")
        };
        let mut args = std::env::args_os();
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(args.next().unwrap_or_default())
            .args(args)
            .env("GLIBC_TUNABLES", tunables)
            .exec();
        // `exec` returns only when it failed: go on with what `mallopt` can set.
        eprintln!("pdgate: could not re-execute with malloc tunables ({err}); going on without the larger tcache");
        // SAFETY: mallopt only sets allocator parameters; no other thread exists yet.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as i32);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as i32);
        }
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    true
}

/// The kernel names a process after the file it executes, so the re-execution through
/// `/proc/self/exe` left it named `exe` in `ps`, `top` and `pgrep`. This gives it back the name
/// it was started under (the last part of its `argv[0]`, which the re-execution keeps: `pdgate`,
/// or whatever the operator renamed or linked it to), before any thread exists (threads take
/// their first name from the thread that starts them).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn restore_process_name() {
    use std::os::unix::ffi::OsStrExt;
    let Some(name) = std::env::args_os().next().and_then(|arg0| {
        std::path::Path::new(&arg0)
            .file_name()
            .map(|n| n.to_os_string())
    }) else {
        return;
    };
    // The kernel keeps 15 bytes and a NUL.
    let mut buf = [0u8; 16];
    let bytes = name.as_bytes();
    let len = bytes.len().min(15);
    buf[..len].copy_from_slice(&bytes[..len]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from `buf`.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, buf.as_ptr());
    }
}

/// `RUST_LOG` wins (e.g. `RUST_LOG=pdgate=info,pdgate::legs=debug`); otherwise the config's
/// `log_level`. `log_json`: one JSON object per line.
fn init_logging(loaded: &LoadedConfig) {
    let rust_log = std::env::var("RUST_LOG").ok();
    pdgate::logs::init(
        loaded.gateway.log_filter(),
        rust_log.as_deref(),
        loaded.gateway.log_json,
    );
}

//! A gateway that cannot open one of its listeners exits at once, with the address and the
//! reason, instead of running without it.
//!
//! Pingora binds each listening service in that service's own thread once `run_forever` has
//! started. An address in use is retried for 30 s; then that thread panics ("Failed to build
//! listeners") and the process lives on without the listener — health checks and discovery
//! running, nothing answering on the port, and a supervisor (systemd, Kubernetes) that sees a
//! running process. Any other bind error (an address not on this host, a port below 1024
//! without the capability) panics the same way without the 30 s.
//!
//! So before Pingora starts, [`check`] binds every listening address the way Pingora will
//! (`SO_REUSEADDR`, so connections of an earlier process in `TIME_WAIT` do not count) and lets
//! it go again without listening; and [`exit_when_a_listener_fails`] turns that panic, should a
//! port be taken between the check and Pingora's bind, into an exit with status 1.
//!
//! A graceful upgrade (`run --upgrade`) takes the running process's listeners over through the
//! upgrade socket, so nothing is checked then: the addresses are the old process's until the
//! handover.

use std::io::ErrorKind;
use std::net::{SocketAddr, ToSocketAddrs};

use socket2::{Domain, Socket, Type};

/// The start of Pingora 0.9's panic message when a listening service cannot bind
/// (`services::listening`, `.expect("Failed to build listeners")`).
const PINGORA_LISTENER_PANIC: &str = "Failed to build listeners";

/// Binds each `(what, host:port)` once and releases it; the first that cannot be bound is the
/// error, naming the listener, the address and what to do.
pub fn check<'a>(listeners: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), String> {
    for (what, addr) in listeners {
        let sock_addr = resolve(addr).map_err(|e| format!("the {what} listener {addr}: {e}"))?;
        bind_once(sock_addr).map_err(|e| format!("the {what} listener {addr}: {}", explain(&e)))?;
    }
    Ok(())
}

/// Installs a panic hook (after the one already there, which prints the panic) that ends the
/// process with status 1 when the panic is a listening service that could not bind.
pub fn exit_when_a_listener_fails() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_listener_failure(message) {
            eprintln!("pdgate: a listener could not be opened; exiting");
            std::process::exit(1);
        }
    }));
}

fn is_listener_failure(panic_message: &str) -> bool {
    panic_message.starts_with(PINGORA_LISTENER_PANIC)
}

/// The first address `addr` names, as Pingora takes it.
fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("not an address ({e})"))?
        .next()
        .ok_or_else(|| "names no address".to_string())
}

fn bind_once(addr: SocketAddr) -> std::io::Result<()> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())
    // Dropped here: never listened on, so nothing could have connected.
}

fn explain(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::AddrInUse => format!(
            "address already in use ({e}): another process listens there. To replace a running \
             pdgate without losing requests, start the new one with --upgrade"
        ),
        ErrorKind::AddrNotAvailable => format!("not an address of this host ({e})"),
        ErrorKind::PermissionDenied => {
            format!("permission denied ({e}): a port below 1024 needs CAP_NET_BIND_SERVICE")
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_socket_listens_on_is_refused_with_its_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = check([("serving", addr.as_str())]).unwrap_err();
        assert!(err.contains(&addr), "{err}");
        assert!(err.contains("serving"), "{err}");
        assert!(err.contains("already in use"), "{err}");
        drop(taken);
        // Released: the same address checks out, and the check itself left nothing bound.
        check([("serving", addr.as_str())]).unwrap();
        check([("serving", addr.as_str())]).unwrap();
        std::net::TcpListener::bind(&addr).unwrap();
    }

    #[test]
    fn an_address_that_names_no_socket_is_refused_with_it() {
        let err = check([("admin", "no-port-here")]).unwrap_err();
        assert!(err.contains("the admin listener no-port-here"), "{err}");
    }

    #[test]
    fn only_pingoras_listener_panic_ends_the_process() {
        assert!(is_listener_failure(
            "Failed to build listeners: Error { etype: BindError, .. }"
        ));
        assert!(!is_listener_failure(
            "called `Option::unwrap()` on a `None` value"
        ));
    }
}

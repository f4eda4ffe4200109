//! The pause process of the sim cluster's real nodes, baked into the image `podha-sim` imports
//! into each node's containerd as the CRI sandbox image. It holds the pod's namespaces: it
//! sleeps until SIGTERM or SIGINT (then exits 0) and reaps any child that is re-parented to it.
//!
//! As PID 1 of a PID namespace, a signal whose handler is the default is dropped by the kernel;
//! a *blocked* signal is kept pending, so the signals are blocked and taken with `sigwait`: no
//! handler, no unsafe code. Built statically (`make node-images`), the image needs no libc.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};

fn reap_children() {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("podha-pause: waitpid: {e}");
                return;
            }
        }
    }
}

fn main() -> ExitCode {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        signals.add(s);
    }
    if let Err(e) = signals.thread_block() {
        eprintln!("podha-pause: block signals: {e}");
        return ExitCode::FAILURE;
    }
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => reap_children(),
            Ok(_) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("podha-pause: sigwait: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}

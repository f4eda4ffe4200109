//! `process::is_alive` on a process whose leader thread has exited while another thread still
//! runs: the kernel shows the leader as a zombie, but the process still holds its files (a
//! killed kwok's kubelet port went on accepting connections). A test binary of its own: it
//! forks, which the library (`forbid(unsafe_code)`) does not.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, fork};
use podha_sim::cluster::process::{ProcRecord, is_alive};

fn leader_state(pid: i32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

#[test]
fn zombie_leader_with_a_live_thread_is_alive() {
    // SAFETY: the child only starts a thread and ends its own main thread; it never returns
    // into the test harness. glibc keeps malloc usable in a forked child.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            std::thread::spawn(|| std::thread::sleep(Duration::from_secs(600)));
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: SYS_exit ends the calling thread only, not the process: that is the point.
            unsafe { nix::libc::syscall(nix::libc::SYS_exit, 0) };
            unreachable!("SYS_exit returned");
        }
        ForkResult::Parent { child } => {
            let pid = child.as_raw();
            let rec = ProcRecord::of(pid).expect("the child runs");
            let deadline = Instant::now() + Duration::from_secs(5);
            while leader_state(pid) != Some('Z') {
                assert!(
                    Instant::now() < deadline,
                    "the child's leader thread never exited"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let alive = is_alive(&rec);
            kill(child, Signal::SIGKILL).expect("kill the child");
            waitpid(child, None).expect("reap the child");
            assert!(alive, "a process with a live thread counts as gone");
            assert!(!is_alive(&rec), "a reaped process counts as alive");
        }
    }
}

//! Child processes in tests: a guard that kills its process when dropped
//! (also when the test panics), Unix signals by process id, and waiting for a
//! server to listen or for an exit with a deadline, so a test of a service
//! binary never leaves it behind.

use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// A running child process, killed (SIGKILL) and reaped on drop if it is
/// still running.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    exited: Option<ExitStatus>,
}

impl ChildProcess {
    /// Spawns `command`; `name` labels the process in panic messages.
    ///
    /// # Panics
    /// When the process cannot be started.
    pub fn spawn(name: impl Into<String>, command: &mut Command) -> Self {
        let name = name.into();
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
        Self {
            name,
            child,
            exited: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (a name for `kill(1)`: `TERM`, `INT`, `KILL`…).
    ///
    /// # Panics
    /// When `kill` fails (the process is gone, say).
    pub fn signal(&self, signal: &str) {
        signal_pid(self.pid(), signal);
    }

    /// The exit status, if the process has exited (without waiting).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("try_wait on a child");
        }
        self.exited
    }

    /// Waits up to `within` for the process to exit; `None` if it is still
    /// running then.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits up to `within` until the process accepts TCP connections on
    /// loopback `port` (a server it starts); `Err` with the exit status if it
    /// exits first.
    ///
    /// # Panics
    /// When nothing listens on `port` within `within`.
    pub fn wait_listening(&mut self, port: u16, within: Duration) -> Result<(), ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = self.try_exit() {
                return Err(status);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not listen on port {port} within {within:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// SIGKILL, then waits for the exit: a crash, as a process manager's
    /// kill or an OOM kill leaves it.
    pub async fn kill_hard(&mut self) -> ExitStatus {
        self.signal("KILL");
        self.wait_exit(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{} survived SIGKILL for 10 s", self.name))
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `signal` (`TERM`, `KILL`…) to process `pid` with `kill(1)`: no
/// `libc` or `unsafe` needed.
///
/// # Panics
/// When `kill` fails.
pub fn signal_pid(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill: {e}"));
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

/// A loopback port free at the time of the call (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

//! A child process that logs to a file and is killed when dropped.

use std::{
    fs,
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Error, Result};

/// A running `etcd` or `kube-apiserver`.
///
/// Dropping it kills the process and reaps it, so that nothing outlives the
/// fleet that started it, including when a test panics.
#[derive(Debug)]
pub(crate) struct Process {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, appending stdout and stderr to `log`.
    pub(crate) fn spawn(
        what: String,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self> {
        let open_log = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| Error::io(format!("opening log {} of {what}", log.display()), e))
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(open_log()?)
            .stderr(open_log()?);
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .map_err(|e| Error::io(format!("starting {what} ({})", program.display()), e))?;
        Ok(Self { what, child, log })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The error to report if the process has already exited.
    pub(crate) fn exit_error(&mut self) -> Option<Error> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(Error::Exited {
            process: self.what.clone(),
            status,
            log: self.log.clone(),
            tail: log_tail(&self.log, 20),
        })
    }

    /// Whether the process failed because its port was taken in the meantime.
    pub(crate) fn lost_port_race(&self) -> bool {
        log_tail(&self.log, 40).contains("address already in use")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // An already reaped child makes `kill` fail; `wait` then returns at once.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the child die when the thread that started it does, so that a test
/// process killed outright (no destructors run) leaves no API servers behind.
///
/// Linux sends the signal when the *thread* that forked exits; fleets are
/// started from the runtime's threads, which live as long as the fleet.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;

    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls only
    // prctl and getppid, which are async-signal-safe; it allocates nothing
    // and touches no memory shared with the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the signal was armed.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the parent process has exited"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_: &mut Command) {}

/// The last `lines` lines of a log file, or a note that it could not be read.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(file) = fs::File::open(path) else {
        return format!("(log {} could not be read)", path.display());
    };
    let all: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A port on 127.0.0.1 that was free a moment ago.
///
/// Another process may take it before ours binds it; callers retry with a new
/// port when [`Process::lost_port_race`] says so.
pub(crate) fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| Error::io("finding a free port on 127.0.0.1", e))
}

/// A wait for something to be ready, given up `timeout` after `started`.
pub(crate) struct Deadline {
    what: String,
    started: Instant,
    timeout: Duration,
    interval: Duration,
}

impl Deadline {
    /// Waiting for `what`, asking every `interval`.
    pub(crate) fn new(
        what: impl Into<String>,
        started: Instant,
        timeout: Duration,
        interval: Duration,
    ) -> Self {
        let what = what.into();
        Self {
            what,
            started,
            timeout,
            interval,
        }
    }

    /// It is not ready yet, for `why` if that is known: fails with
    /// [`Error::Timeout`], reporting `why` as the last error, once the time
    /// is up; else waits the interval before it is asked again.
    pub(crate) async fn not_yet(&self, why: Option<String>) -> Result<()> {
        if self.started.elapsed() >= self.timeout {
            return Err(Error::Timeout {
                what: self.what.clone(),
                after: self.timeout,
                last_error: why,
            });
        }
        tokio::time::sleep(self.interval).await;
        Ok(())
    }
}
